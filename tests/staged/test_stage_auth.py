"""The stage secret: HMAC challenge-response in the Hello exchange, with raw frames against a
StageServer (over a stub runtime: no model is loaded, only the handshake and sessions run).

An unauthenticated peer, a wrong secret, a replayed proof, a stage that cannot prove the secret
back, garbage and oversized frames: none opens a session, each is refused (logged), and the
good session already open stays open. Bit-exact serving with a secret: test_stage_auth_native.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import attrs
import pytest
import trio
import trio.testing
from loguru import logger

from skippy.staged import (
    Auth,
    Error,
    FrameStream,
    Hello,
    Open,
    StageDisconnected,
    connect,
)
from skippy.staged._auth import (
    _STAGE,
    _UPSTREAM,
    ENV_VAR,
    StageSecretError,
    is_loopback,
    load_secret,
    mac,
    say_hello,
)
from skippy.staged._stage import HANDSHAKE_MAX_FRAME_BYTES, StageServer

pytestmark = pytest.mark.staged

SECRET = b"correct horse battery staple"
DIGEST = "d" * 64


class StubRuntime:
    """What StageServer reads of a last stage [3, 6) of a 6-layer model; it never decodes here."""

    layers, digest, lanes, cells, last, n_batch = (3, 6), DIGEST, 4, 256, True, 64
    model = SimpleNamespace(n_layer=6, n_embd=8)

    def hello(self, stage: int, n_stages: int, layer_end: int, lanes: int, cells: int) -> Hello:
        return Hello(stage, n_stages, 3, layer_end, 6, 8, self.digest, lanes=lanes, cells=cells)

    def seq_rm(self, seq: int) -> None:
        pass


UPSTREAM_HELLO = Hello(0, 1, 0, 3, 6, 8, DIGEST)


@pytest.fixture
def warnings():
    lines: list[str] = []
    logger.enable("skippy")
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    yield lines
    logger.remove(sink)
    logger.disable("skippy")


async def _stage(nursery, secret: bytes | None) -> tuple[StageServer, int]:
    server = StageServer(StubRuntime(), None, secret=secret)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, server.handle, listeners)
    return server, listeners[0].socket.getsockname()[1]


async def _still_open(link: FrameStream) -> bool:
    """Nothing arrives on an open, idle session (no Error, no EOF)."""
    with trio.move_on_after(0.3) as waited:
        await link.receive()
    return waited.cancelled_caught


async def test_a_good_peer_opens_a_session_and_no_bad_one_displaces_it(nursery, warnings):
    with trio.fail_after(20):
        server, port = await _stage(nursery, SECRET)
        good = await connect("127.0.0.1", port)
        reply = await say_hello(good, UPSTREAM_HELLO, SECRET, "stage")
        assert isinstance(reply, Hello) and (reply.layer_begin, reply.layer_end, reply.lanes) == (3, 6, 4)
        assert server.sessions == 1

        async def refused(frames_then: list, *, proof=None) -> Error:
            """A raw peer: its frames, then (if given) a proof made from the stage's challenge."""
            link = await connect("127.0.0.1", port)
            for frame in frames_then:
                await link.send(frame)
            if proof is not None:
                challenge = await link.receive()
                assert isinstance(challenge, Auth) and len(challenge.nonce) == 32
                await link.send(proof(challenge))
            answer = await link.receive()
            try:  # and the stage hung up (a reset when it left our unread bytes behind)
                assert await link.receive() is None
            except StageDisconnected:
                pass
            await link.aclose()
            assert isinstance(answer, Error), answer
            return answer

        # no secret at all (a Hello without a challenge)
        assert (await refused([UPSTREAM_HELLO])).code == "unauthenticated"
        # the wrong secret
        hello = attrs.evolve(UPSTREAM_HELLO, nonce=bytes(range(32)))
        wrong = await refused([hello], proof=lambda c: Auth(mac(b"not the secret at all!", _UPSTREAM, hello, c.nonce)))
        assert wrong.code == "unauthenticated" and "authentication failed" in wrong.message
        # the stage's own MAC reflected back as the proof
        assert (await refused([hello], proof=lambda c: Auth(c.mac))).code == "unauthenticated"
        # something else than the proof
        assert (await refused([hello], proof=lambda c: Open(1, {}))).code == "unauthenticated"
        # a frame before the Hello, and garbage
        assert (await refused([Open(1, {})])).code == "bad_hello"
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        await raw.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await FrameStream(raw).receive()
        assert isinstance(answer, Error) and answer.code == "bad_frame" and "bad magic" in answer.message
        await raw.aclose()
        # a handshake frame over the pre-admission maximum is refused from its header
        big = attrs.evolve(UPSTREAM_HELLO, model_digest="x" * HANDSHAKE_MAX_FRAME_BYTES)
        answer = await refused([big])
        assert answer.code == "bad_frame" and "larger than the configured maximum" in answer.message

        assert server.sessions == 1 and server.refused == 7
        assert await _still_open(good)
        assert sum("refused" in w or "refusing" in w for w in warnings) >= 7
        await good.aclose()


async def test_a_replayed_proof_opens_nothing(nursery):
    """A recorded handshake (Hello with its nonce, and the proof that answered it) replayed on a
    new connection: the stage's fresh challenge makes the old proof wrong."""
    with trio.fail_after(20):
        server, port = await _stage(nursery, SECRET)
        hello = attrs.evolve(UPSTREAM_HELLO, nonce=bytes(range(32)))
        recorded = await connect("127.0.0.1", port)
        await recorded.send(hello)
        challenge = await recorded.receive()
        proof = Auth(mac(SECRET, _UPSTREAM, hello, challenge.nonce))
        await recorded.send(proof)
        assert isinstance(await recorded.receive(), Hello)  # the genuine session
        assert server.sessions == 1

        replay = await connect("127.0.0.1", port)
        await replay.send(hello)
        fresh = await replay.receive()
        assert isinstance(fresh, Auth) and fresh.nonce != challenge.nonce
        await replay.send(proof)
        answer = await replay.receive()
        assert isinstance(answer, Error) and answer.code == "unauthenticated"
        assert server.sessions == 1 and await _still_open(recorded)
        await replay.aclose()
        await recorded.aclose()


async def _fake_stage(stage: FrameStream, answer_with) -> None:
    hello = await stage.receive()
    assert isinstance(hello, Hello) and len(hello.nonce) == 32
    await stage.send(answer_with(hello))


async def test_upstream_refuses_a_stage_that_cannot_prove_the_secret():
    """The stage's side of the proof: a replayed challenge (made for another nonce), a stage
    without a secret, and one with another secret are all refused by upstream itself."""
    with trio.fail_after(10):
        old_hello = attrs.evolve(UPSTREAM_HELLO, nonce=b"\x07" * 32)
        stage_nonce = b"\x09" * 32
        recorded = Auth(mac(SECRET, _STAGE, old_hello, stage_nonce), stage_nonce)
        for answer_with, problem in [
            (lambda hello: recorded, "does not know the stage secret"),
            (lambda hello: Auth(mac(b"another secret, 16+ bytes", _STAGE, hello, stage_nonce), stage_nonce),
             "does not know the stage secret"),
            (lambda hello: StubRuntime().hello(1, 2, 6, 4, 256), "did not authenticate"),
        ]:
            a, b = trio.testing.memory_stream_pair()
            upstream, stage = FrameStream(a), FrameStream(b)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_fake_stage, stage, answer_with)
                answer = await say_hello(upstream, UPSTREAM_HELLO, SECRET, "fake")
            assert isinstance(answer, Error) and answer.code == "unauthenticated" and problem in answer.message


async def test_without_a_secret_on_either_side_the_handshake_is_as_before(nursery):
    with trio.fail_after(10):
        server, port = await _stage(nursery, None)
        link = await connect("127.0.0.1", port)
        assert isinstance(await say_hello(link, UPSTREAM_HELLO, None, "stage"), Hello)
        assert server.sessions == 1
        await link.aclose()


def test_load_secret(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    path.chmod(0o600)
    assert load_secret(path, {}) == SECRET
    assert load_secret(None, {ENV_VAR: "x" * 20}) == b"x" * 20
    assert load_secret(None, {}) is None
    assert load_secret(path, {ENV_VAR: "y" * 20}) == SECRET  # the file wins
    (tmp_path / "short").write_bytes(b"tiny\n")
    with pytest.raises(StageSecretError, match="holds 4 bytes; a stage secret needs at least 16"):
        load_secret(tmp_path / "short", {})
    with pytest.raises(StageSecretError, match="cannot read the stage secret file"):
        load_secret(tmp_path / "missing", {})


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("[::1]", True),
                                                ("localhost", True), ("0.0.0.0", False), ("::", False),
                                                ("10.0.0.2", False), ("stage.example", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_stage_on_a_network_address_without_a_secret_refuses_to_start(tmp_path):
    argv = [sys.executable, "-m", "skippy", "stage", "--model", str(tmp_path / "m.gguf"), "--layers", "1:2",
            "--listen", "0.0.0.0:0"]
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "skippy: error: refusing to listen on 0.0.0.0 without a stage secret: give --secret-file PATH (or "
        "$SKIPPY_STAGE_SECRET) to every stage, or --insecure on a network you trust"]
