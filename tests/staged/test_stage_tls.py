"""TLS on stage links, against a StageServer over a stub runtime (no model: handshakes and sessions).

A stage serving TLS with the stage secret opens a session for a client that trusts its CA and
proves the secret; a plaintext peer, a client that does not trust the CA and one expecting another
name are refused at the TLS handshake (logged) and the open session serves on; a TLS client at a
plaintext stage fails cleanly; bad TLS files fail on the command line in one line. Bit-exact
serving over TLS: test_stage_tls_native.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio

from skippy.staged import FrameError, Hello, StageDisconnected, connect
from skippy.staged._auth import ENV_VAR, say_hello
from skippy.staged._stage import serve_stage
from skippy.staged._tls import StageTLSError, client_tls, pair, server_context

from ._certs import STAGE_NAME, make_tls_files
from .test_stage_auth import SECRET, UPSTREAM_HELLO, StubRuntime, _still_open, warnings  # noqa: F401 (fixture)

pytestmark = pytest.mark.staged


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


async def _tls_stage(nursery, certs, secret: bytes | None = SECRET, tls: bool = True):
    """A last stage [3, 6) served by serve_stage itself (its real listeners): the bound port."""
    return await nursery.start(lambda task_status: serve_stage(
        StubRuntime(), "127.0.0.1", 0, None, secret=secret,
        tls=server_context(certs.cert, certs.key) if tls else None, task_status=task_status))


async def test_tls_and_secret_open_a_session_and_refuse_plaintext_and_untrusting_peers(nursery, certs, warnings):
    with trio.fail_after(30):
        port = await _tls_stage(nursery, certs)
        good = await connect("127.0.0.1", port, tls=client_tls(certs.ca))
        assert isinstance(good.stream, trio.SSLStream)
        reply = await say_hello(good, UPSTREAM_HELLO, SECRET, "stage")
        assert isinstance(reply, Hello) and (reply.layer_begin, reply.layer_end) == (3, 6)

        # a plaintext peer saying the right Hello gets no Hello (nor any frame) back
        plain = await connect("127.0.0.1", port)
        await plain.send(UPSTREAM_HELLO)
        try:
            answer = await plain.receive()
        except (StageDisconnected, FrameError) as exc:
            answer = exc
        assert not isinstance(answer, Hello), answer
        await plain.aclose()

        # a client that trusts another CA, and one that expects another name, refuse the stage
        with pytest.raises(StageDisconnected, match="TLS handshake with 127.0.0.1:.* failed: .*certificate verify failed"):
            await connect("127.0.0.1", port, tls=client_tls(certs.other_ca))
        with pytest.raises(StageDisconnected, match="Hostname mismatch"):
            await connect("127.0.0.1", port, tls=client_tls(certs.ca, "another-stage.internal"))

        # each was refused at the TLS handshake, logged; the good session serves on
        while sum("TLS handshake failed" in w for w in warnings) < 3:
            await trio.sleep(0.01)
        assert all("refused 127.0.0.1:" in w for w in warnings if "TLS handshake failed" in w)
        assert await _still_open(good)
        await good.aclose()


async def test_a_configured_server_name_is_checked_instead_of_the_host(nursery, certs):
    with trio.fail_after(20):
        port = await _tls_stage(nursery, certs, secret=None)
        link = await connect("127.0.0.1", port, tls=client_tls(certs.ca, STAGE_NAME))
        assert link.stream.getpeercert()["subjectAltName"]  # the stage's certificate, verified
        assert isinstance(await say_hello(link, UPSTREAM_HELLO, None, "stage"), Hello)
        await link.aclose()


async def test_a_tls_client_at_a_plaintext_stage_fails_at_the_handshake(nursery, certs):
    with trio.fail_after(20):
        port = await _tls_stage(nursery, certs, secret=None, tls=False)
        with pytest.raises(StageDisconnected, match="TLS handshake with 127.0.0.1:.* failed"):
            await connect("127.0.0.1", port, tls=client_tls(certs.ca))
        # and the plaintext stage still serves a plaintext client
        link = await connect("127.0.0.1", port)
        assert isinstance(await say_hello(link, UPSTREAM_HELLO, None, "stage"), Hello)
        await link.aclose()


def test_tls_files_that_do_not_load_say_which_and_why(certs, tmp_path):
    with pytest.raises(StageTLSError, match="cannot load the TLS certificate .*missing.pem.*No such file"):
        server_context(tmp_path / "missing.pem", certs.key)
    with pytest.raises(StageTLSError, match="cannot load the TLS certificate"):
        server_context(certs.ca, certs.key)  # a certificate that is not the key's
    with pytest.raises(StageTLSError, match="cannot load the TLS CA file"):
        client_tls(tmp_path / "missing-ca.pem")
    with pytest.raises(StageTLSError, match="go together"):
        pair(certs.cert, None)
    assert pair(None, None) is False and pair(certs.cert, certs.key) is True


@pytest.mark.parametrize(("command", "expected"), [
    (["stage", "--layers", "1:2", "--listen", "127.0.0.1:0", "--tls-cert", "{cert}"],
     "skippy: error: --tls-cert and --tls-key go together: give both or neither"),
    (["stage", "--layers", "1:2", "--listen", "127.0.0.1:0", "--next", "127.0.0.1:9", "--tls-ca", "{missing}"],
     "skippy: error: cannot load the TLS CA file '{missing}': No such file or directory"),
    (["serve", "--tls-cert", "{cert}", "--tls-key", "{missing}"],
     "skippy: error: cannot load the TLS certificate '{cert}' with the key '{missing}': No such file or directory"),
    (["pipeline", "--tls-ca", "{ca}"],
     "skippy: error: --tls-ca puts the stage links on TLS: the stages need --tls-cert and --tls-key"),
])
def test_the_cli_refuses_bad_tls_options_in_one_line(certs, tmp_path, command, expected):
    values = {"cert": str(certs.cert), "ca": str(certs.ca), "missing": str(tmp_path / "missing.pem")}
    argv = [sys.executable, "-m", "skippy", *[part.format(**values) for part in command],
            "--model", str(tmp_path / "m.gguf")]
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [expected.format(**values)]
