"""Streamed tokens written from the engine step (server._inline_writes), over real loopback sockets
and the real engine on a FakeRuntime (scheduler and protocol plumbing, no llama claim): the same
bytes as the response's task writes, every token once and in order for a client that does not read,
a client that leaves frees its request, HTTP/1.0 bodies, the switch that turns it off; and a client
that asked for the close (HTTP/1.0, Connection: close) gets it after the stream, on either path."""

from __future__ import annotations

import json
import re
import socket
from contextlib import asynccontextmanager
from functools import partial

import h11
import httpx
import pytest
import trio

import skippy
from skippy.server import _inline_writes, create_app, serve_app
from skippy.testing import FakeRuntime, open_fake_engine

from ._live import ENGINE, metric
from .test_api_fields import P1, fake_server, sse_data, text_of

pytestmark = pytest.mark.server

BODY = {"model": "m", "prompt": P1, "temperature": 0, "ignore_eos": True, "stream": True}


def _writes(text: str) -> tuple[float, float]:
    return (metric(text, "skippy_stream_writes_total", 'path="inline"'),
            metric(text, "skippy_stream_writes_total", 'path="task"'))


def _comparable(raw: str) -> str:
    return re.sub(r'"(id|created)": ("[^"]*"|\d+)', "", raw)


async def test_inline_writes_send_the_same_bytes_as_the_task_and_most_tokens_go_inline():
    raws, counts = {}, {}
    for inline in (True, False):
        with trio.fail_after(20):
            async with fake_server(inline_writes=inline) as (http, rt, _):
                async with http.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 60}) as r:
                    assert r.status_code == 200
                    raws[inline] = (await r.aread()).decode()
                counts[inline] = _writes((await http.get("/metrics")).text)
    assert _comparable(raws[True]) == _comparable(raws[False])
    chunks = sse_data(raws[True])
    assert "".join(c["choices"][0]["text"] for c in chunks) == text_of(rt, rt.solo(P1, 60))
    assert counts[False][0] == 0
    assert counts[True][0] >= 30  # the reader waited between steps: most tokens went out inline
    assert counts[True][1] < counts[False][1]


@pytest.mark.parametrize("chained", [True, False])
async def test_inline_writes_happen_while_the_next_step_computes(monkeypatch, chained):
    """Chained, the next step is launched before a token is routed: it is written at once. Unchained,
    the next step is composed after the routing: its bytes wait until that step is handed to the
    worker (Engine.after_next_step_start). Either way no inline write delays a decode."""
    from skippy.actors import worker as W

    jobs = {"started": 0, "collected": 0}  # handed to the worker; whose result the event loop took
    busy_at_write = []
    start, result = W.Worker.start, W.Job.result

    def counted_start(self, fn):
        jobs["started"] += 1
        return start(self, fn)

    async def counted_result(self, on_cancel=None):
        try:
            return await result(self, on_cancel)
        finally:
            jobs["collected"] += 1

    real, real_worker = _inline_writes._send_now, _inline_writes._WorkerSocket.send

    def spy(stream, data):
        busy_at_write.append(jobs["started"] > jobs["collected"])
        return real(stream, data)

    def worker_spy(self, data):  # a run ahead's write, between two of its decodes (run_ahead)
        busy_at_write.append(jobs["started"] > jobs["collected"])
        return real_worker(self, data)

    monkeypatch.setattr(W.Worker, "start", counted_start)
    monkeypatch.setattr(W.Job, "result", counted_result)
    monkeypatch.setattr(_inline_writes, "_send_now", spy)
    monkeypatch.setattr(_inline_writes._WorkerSocket, "send", worker_spy)
    rt = FakeRuntime(n_ctx=512, n_batch=32, n_seq_max=8, n_vocab=64)
    with trio.fail_after(20):
        async with open_fake_engine(rt, overlap_steps=chained) as engine:
            app = create_app(engine, model_names=["m"])
            async with trio.open_nursery() as nursery:
                (url,) = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
                async with httpx.AsyncClient(base_url=url, timeout=20) as http:
                    async with http.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 60}) as r:
                        raw = (await r.aread()).decode()
                    inline, task = _writes((await http.get("/metrics")).text)
                nursery.cancel_scope.cancel()
    chunks = sse_data(raw)
    assert "".join(c["choices"][0]["text"] for c in chunks) == text_of(rt, rt.solo(P1, 60))
    assert inline >= 50
    # every inline write but one flushed before the engine went idle came after the next step was
    # handed to the worker, before the event loop took its result
    assert len(busy_at_write) >= 50 and sum(not b for b in busy_at_write) <= 1, busy_at_write


@asynccontextmanager
async def served(engine, **app_options):
    """An http client of `engine` served on an ephemeral loopback port."""
    app = create_app(engine, model_names=["m"], **app_options)
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=url, timeout=20) as http:
            yield http
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def synth_server(path, **app_options):
    async with skippy.open_engine(path, **ENGINE) as engine:
        async with served(engine, **app_options) as http:
            yield http


async def test_a_chat_stream_with_logprobs_and_usage_is_the_same_inline(synth_model_path):
    """The role chunk starts the response; logprob chunks are rendered per token (a real tiny model
    with a chat template)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0,
            "stream": True, "logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True}}
    raws, counts = {}, {}
    for inline in (True, False):
        with trio.fail_after(60):
            async with synth_server(synth_model_path("llama"), inline_writes=inline) as http:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    raws[inline] = (await r.aread()).decode()
                counts[inline] = _writes((await http.get("/metrics")).text)
    assert _comparable(raws[True]) == _comparable(raws[False])
    chunks = sse_data(raws[True])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c["choices"][0]["logprobs"]["content"] for c in chunks[1:-2])
    assert counts[False][0] == 0 and counts[True][0] >= 10


async def _raw_request(url: str, body: dict, http_version: str = "1.1", rcvbuf: int | None = None,
                       extra: bytes = b""):
    host, port = url.removeprefix("http://").split(":")
    sock = trio.socket.socket()
    if rcvbuf is not None:  # before connecting, so the window it advertises is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    data = json.dumps(body).encode()
    await stream.send_all(b"POST /v1/completions HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"%sContent-Length: %d\r\n\r\n%s" % (http_version.encode(), extra, len(data), data))
    return stream


async def _read_response(stream: trio.SocketStream) -> tuple[h11.Response, bytes]:
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    client.send(h11.EndOfMessage())
    response, body = None, b""
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return response, body


def spy_on_sends(monkeypatch, seen) -> None:
    """`seen(data, sent)` after every inline write, from the event loop or from a run ahead."""
    real, real_worker = _inline_writes._send_now, _inline_writes._WorkerSocket.send

    def spy(stream, data):
        sent = real(stream, data)
        seen(data, sent)
        return sent

    def worker_spy(self, data):
        sent = real_worker(self, data)
        seen(data, sent)
        return sent

    monkeypatch.setattr(_inline_writes, "_send_now", spy)
    monkeypatch.setattr(_inline_writes._WorkerSocket, "send", worker_spy)


async def test_a_client_that_does_not_read_gets_every_token_once_in_order(monkeypatch):
    partial = []
    spy_on_sends(monkeypatch, lambda data, sent: sent < len(data) and partial.append((sent, len(data))))
    n = 480
    with trio.fail_after(30):
        async with fake_server() as (http, rt, app):
            engine = app.state.server.engine
            stream = await _raw_request(http.base_url.__str__().rstrip("/"), {**BODY, "max_tokens": n}, rcvbuf=4096)
            async with stream:
                while engine.stats().finished.get("length", 0) == 0:  # the client reads nothing meanwhile
                    await trio.sleep(0.01)
                await trio.sleep(0.05)
                response, body = await _read_response(stream)
            inline, task = _writes((await http.get("/metrics")).text)
    assert response.status_code == 200
    chunks = sse_data(body.decode())
    assert "".join(c["choices"][0]["text"] for c in chunks) == text_of(rt, rt.solo(P1, n))  # once, in order
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert partial, "the socket never refused a write: the backlog path was not exercised"
    assert inline >= 1 and task >= 2  # inline until the socket filled, the task's coalesced writes after


async def test_a_client_that_leaves_during_inline_writes_frees_its_request():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, app):
            engine = app.state.server.engine
            stream = await _raw_request(str(http.base_url).rstrip("/"), {**BODY, "max_tokens": 480})
            seen = b""
            while seen.count(b"data: ") < 5:
                seen += await stream.receive_some(4096)
            await stream.aclose()
            while engine.live or engine.stats().running:
                await trio.sleep(0.01)
            inline, _ = _writes((await http.get("/metrics")).text)
            assert engine.stats().finished.get("length", 0) == 0  # cancelled, not run to the end
    assert inline >= 1


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("version, extra", [("1.0", b""), ("1.1", b"Connection: close\r\n")])
async def test_a_client_that_asked_for_the_close_gets_it_after_the_stream(version, extra, inline):
    """The body of an HTTP/1.0 stream ends where the server closes. It never closed: hypercorn says
    http.disconnect to the app while it closes the connection inside the app's last send, and
    EventStream's disconnect watcher cancelled that close. Both write paths."""
    with trio.fail_after(20):
        async with fake_server(inline_writes=inline) as (http, rt, _):
            stream = await _raw_request(str(http.base_url).rstrip("/"), {**BODY, "max_tokens": 40},
                                        http_version=version, extra=extra)
            raw = b""
            async with stream:
                while chunk := await stream.receive_some(65536):
                    raw += chunk
            inline_writes, _ = _writes((await http.get("/metrics")).text)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    if version == "1.0":  # no chunks: the SSE bytes as they are
        assert b"transfer-encoding" not in head.lower()
    else:
        body = b"".join(_unchunk(body))
    chunks = sse_data(body.decode())
    assert "".join(c["choices"][0]["text"] for c in chunks) == text_of(rt, rt.solo(P1, 40))
    assert (inline_writes >= 20) if inline else inline_writes == 0


def _unchunk(body: bytes):
    while True:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return
        yield rest[:n]
        body = rest[n + 2:]


@pytest.mark.parametrize("argv, expected", [([], True), (["--no-inline-writes"], False)])
def test_skippy_serve_passes_its_inline_writes_switch_to_the_app(monkeypatch, argv, expected):
    """`skippy serve` (and `skippy pipeline`, through the same server options) hands --inline-writes
    to create_app; the engine here is a stand-in, since nothing is served."""
    from skippy import cli, server

    seen = {}

    class Stop(Exception):
        pass

    def create_app(engine, **kwargs):
        seen.update(kwargs)
        raise Stop

    @asynccontextmanager
    async def opener():
        yield type("E", (), {"model_name": "m"})()

    monkeypatch.setattr(server, "create_app", create_app)
    args = cli._parser().parse_args(["serve", *argv])
    with pytest.raises(Stop):
        cli._serve_engine(args, opener, "127.0.0.1", 0)
    assert seen["inline_writes"] is expected


@pytest.mark.parametrize("n_streams", [1, 3])
async def test_a_run_ahead_writes_from_the_worker_thread_the_same_bytes(monkeypatch, n_streams):
    """With every stream written inline, steady steps run ahead of the event loop (scheduling.run_ahead):
    most chunks are written from the worker thread, and each response's bytes are what the engine
    without runs sends."""
    import threading

    raws: dict[bool, list[str]] = {}
    threads: list[int] = []
    spy_on_sends(monkeypatch, lambda data, sent: threads.append(threading.get_ident()))
    for run_ahead in (True, False):
        threads.clear()
        rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=8, n_vocab=64)
        with trio.fail_after(20):
            async with open_fake_engine(rt, run_ahead=run_ahead) as engine, served(engine) as http:
                out = [""] * n_streams

                async def one(i):
                    body = {**BODY, "prompt": [1 + i, 2, 3], "max_tokens": 80}
                    async with http.stream("POST", "/v1/completions", json=body) as r:
                        out[i] = (await r.aread()).decode()

                async with trio.open_nursery() as clients:
                    for i in range(n_streams):
                        clients.start_soon(one, i)
        raws[run_ahead] = [_comparable(raw) for raw in out]
        loop = threading.get_ident()
        off_loop = sum(t != loop for t in threads)
        if run_ahead:
            assert off_loop >= 20 * n_streams, (off_loop, len(threads))  # of 80 each; most on an idle box
        else:
            assert off_loop == 0
        for i, raw in enumerate(out):
            text = "".join(c["choices"][0]["text"] for c in sse_data(raw))
            assert text == text_of(rt, rt.solo([1 + i, 2, 3], 80))
    assert raws[True] == raws[False]
