"""HTTP limits, over real sockets: a body over the limit is answered 413 (OpenAI's error body)
before it is read, whether its length was announced or it came chunked; oversized headers get
431; a keep-alive connection is closed after its request budget; the server serves on."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio

from skippy.server import HttpLimits, create_app, serve_app
from skippy.testing import FakeRuntime, open_fake_engine

from .test_errors import assert_error_shape

pytestmark = pytest.mark.server

OK = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}
LIMIT = 1 << 20


@asynccontextmanager
async def limited_server(limits: HttpLimits):
    """(host, port) of an app over a fake engine served with `limits`."""
    async with open_fake_engine(FakeRuntime(n_ctx=256, n_batch=32, n_seq_max=4, n_vocab=64)) as engine:
        app = create_app(engine, model_names=["m"])
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve_app, app, "127.0.0.1", 0, limits=limits))
            host, port = binds[0].removeprefix("http://").rsplit(":", 1)
            yield host, int(port)
            nursery.cancel_scope.cancel()


async def _read_response(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length (what the server sends for these errors)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = await stream.receive_some(65536)
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


async def test_an_announced_oversized_body_is_refused_before_it_is_sent():
    with trio.fail_after(20):
        async with limited_server(HttpLimits(max_body_bytes=LIMIT)) as (host, port):
            stream = await trio.open_tcp_stream(host, port)
            t0 = time.perf_counter()
            await stream.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 104857600\r\n\r\n{\"model\":")  # 100 MiB promised, 9 bytes sent
            status, headers, body = await _read_response(stream)
            elapsed = time.perf_counter() - t0
            assert status == 413 and headers["connection"] == "close"
            assert_error_shape(json.loads(body))
            assert json.loads(body)["error"]["code"] == "request_too_large"
            assert elapsed < 0.5, elapsed
            await stream.aclose()
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
                assert (await http.post("/v1/completions", json=OK)).status_code == 200


async def test_a_chunked_body_is_cut_off_once_over_the_limit(nursery):
    with trio.fail_after(20):
        async with limited_server(HttpLimits(max_body_bytes=LIMIT)) as (host, port):
            stream = await trio.open_tcp_stream(host, port)
            sent = 0

            async def upload() -> None:  # 64 MiB in 64 KiB chunks, unless stopped
                nonlocal sent
                await stream.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n")
                chunk = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"
                with trio.move_on_after(10):
                    for _ in range(1024):
                        await stream.send_all(chunk)
                        sent += 65536

            t0 = time.perf_counter()
            async with trio.open_nursery() as inner:
                inner.start_soon(upload)
                status, headers, body = await _read_response(stream)
                inner.cancel_scope.cancel()
            elapsed = time.perf_counter() - t0
            assert status == 413 and headers["connection"] == "close"
            assert_error_shape(json.loads(body))
            assert elapsed < 0.5, elapsed
            assert sent < 64 << 20  # the rest was never wanted
            await trio.aclose_forcefully(stream)
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
                assert (await http.post("/v1/completions", json=OK)).status_code == 200


async def test_bodies_within_the_limit_and_oversized_headers():
    with trio.fail_after(20):
        async with limited_server(HttpLimits(max_body_bytes=LIMIT, max_header_bytes=4096)) as (host, port):
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
                padded = {**OK, "user": "x" * (LIMIT - 200)}  # just under the limit: served
                r = await http.post("/v1/completions", content=json.dumps(padded).encode())
                assert r.status_code == 200, r.text
                r = await http.post("/v1/completions", content=json.dumps({**OK, "user": "x" * LIMIT}).encode())
                assert r.status_code == 413
                assert_error_shape(r.json())
                r = await http.get("/health", headers={"x-big": "y" * 8192})
                assert r.status_code == 431
                assert_error_shape(r.json())
                r = await http.get("/health", headers={f"x-{i}": "y" * 8192 for i in range(32)})
                assert r.status_code == 431  # hypercorn's own bound, on headers still arriving
                assert (await http.get("/health")).status_code == 200


async def test_a_keep_alive_connection_is_closed_after_its_request_budget():
    with trio.fail_after(20):
        async with limited_server(HttpLimits(max_requests_per_connection=3)) as (host, port):
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
                answers = [await http.get("/health") for _ in range(4)]
            assert all(r.status_code == 200 for r in answers)
            assert [r.headers.get("connection") for r in answers] == [None, None, "close", None]


async def test_an_answer_before_the_body_still_keeps_the_connection_usable():
    """hypercorn closes a connection whose request body was not read to its end when the answer is
    done, without saying so; RequestLimits reads the rest first, so the next request on it is served."""
    with trio.fail_after(20):
        async with limited_server(HttpLimits()) as (host, port):
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
            await trio.sleep(0.2)  # /health answers without reading the body; the rest comes later
            await stream.send_all(b"67890")
            status, headers, _ = await _read_response(stream)
            assert status == 200 and "connection" not in headers
            await stream.send_all(b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nnull")
            status, headers, body = await _read_response(stream)  # a 405, also answered without the body
            assert status == 405 and "connection" not in headers
            assert_error_shape(json.loads(body))
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = await _read_response(stream)
            assert status == 200 and json.loads(body)["status"] == "ok"
            await stream.aclose()


def test_limits_must_be_positive_integers():
    with pytest.raises(ValueError, match="max_body_bytes must be a positive integer"):
        HttpLimits(max_body_bytes=0)
    with pytest.raises(ValueError, match="max_requests_per_connection"):
        HttpLimits(max_requests_per_connection=1.5)
