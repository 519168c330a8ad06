"""The API over HTTPS (serve_app with certfile/keyfile, hypercorn's TLS), with a CA made at test time.

The openai SDK trusting the test CA completes (streamed and not); a client that does not trust
it, and a plaintext client at the HTTPS port, get no answer; the server serves on after both.
"""

from __future__ import annotations

import ssl
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio

import skippy
from skippy.server import create_app, serve_app
from skippy.server.serve import TLSConfigError, check_tls_files

from ._live import ENGINE, in_thread

pytestmark = pytest.mark.server

MODEL = "test-model"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """(ca, cert, key) PEM paths: a throwaway CA and a certificate for 127.0.0.1 it signed."""
    trustme = pytest.importorskip("trustme", reason="TLS tests need trustme (a dev extra)")
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    leaf.private_key_pem.write_to_path(str(paths[2]))
    for i, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(str(paths[1]), append=i > 0)
    return paths


@asynccontextmanager
async def https_server(model, cert, key):
    async with skippy.open_engine(model, **ENGINE) as engine:
        app = create_app(engine, model_names=[MODEL])
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve_app, app, "127.0.0.1", 0, certfile=cert, keyfile=key))
            yield binds[0]
            nursery.cancel_scope.cancel()


def _client(url: str, verify):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30,
                         http_client=httpx.Client(verify=verify, timeout=30))


async def test_the_openai_sdk_completes_over_https_and_untrusting_or_plaintext_clients_get_nothing(smollm2, certs):
    import openai

    ca, cert, key = certs
    with trio.fail_after(90):
        async with https_server(smollm2, cert, key) as url:
            assert url.startswith("https://127.0.0.1:")
            client = _client(url, ssl.create_default_context(cafile=str(ca)))
            done = await in_thread(client.completions.create, model=MODEL, prompt="The capital of France is",
                                   max_tokens=8, temperature=0)
            assert done.usage.completion_tokens >= 1 and done.choices[0].text

            # a client trusting only the system's CAs refuses the server's certificate
            untrusting = _client(url, True)
            with pytest.raises(openai.APIConnectionError) as failed:
                await in_thread(untrusting.completions.create, model=MODEL, prompt="x", max_tokens=1)
            assert "CERTIFICATE_VERIFY_FAILED" in repr(failed.value.__cause__)
            # plain HTTP at the HTTPS port: the TLS handshake fails, nothing is served
            with pytest.raises(httpx.HTTPError):
                await in_thread(httpx.get, url.replace("https://", "http://") + "/health", timeout=10)

            # and the server serves on: the same answer, streamed this time
            def stream():
                return list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                                      temperature=0, stream=True))
            chunks = await in_thread(stream)
            assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text


def test_a_certificate_that_does_not_load_fails_before_anything_is_bound(certs, tmp_path):
    ca, cert, key = certs
    assert check_tls_files(None, None) is False and check_tls_files(cert, key) is True
    with pytest.raises(TLSConfigError, match="go together"):
        check_tls_files(cert, None)
    with pytest.raises(TLSConfigError, match="cannot load the TLS certificate .* No such file or directory"):
        check_tls_files(cert, tmp_path / "missing.pem")
    with pytest.raises(TLSConfigError, match="cannot load the TLS certificate"):
        check_tls_files(ca, key)  # a certificate that is not the key's
