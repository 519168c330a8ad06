"""Faults through the engine's actors over a FakeRuntime (scheduling logic; llama.cpp behaviour is in
tests/native/test_faults_native.py): a failing step under load fails exactly its own requests and
the engine keeps serving; cancelling the engine's enclosing scope mid-step leaves no task, thread
or waiting consumer behind; a client that hangs up mid-upload is not a server error."""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest
import trio

import skippy
from skippy.errors import StepFailedError
from skippy.testing import FakeRuntime, open_fake_engine


def prompt(i: int, n: int = 10) -> list[int]:
    return [(i * 13 + 5 * k) % 60 + 1 for k in range(n)]


async def consume_all(engine, specs, ids: dict[int, int] | None = None) -> list[list]:
    """Every spec's events; `ids` gets spec index -> the engine's request id."""
    out: list[list] = [[] for _ in specs]

    async def one(i, p, kw):
        stream = engine.generate(p, **kw)
        if ids is not None:
            ids[i] = stream.request.id
        async for event in stream:
            out[i].append(event)

    async with trio.open_nursery() as nursery:
        for i, (p, kw) in enumerate(specs):
            nursery.start_soon(one, i, p, kw)
    return out


def assert_one_final_last(events) -> None:
    assert sum(e.final for e in events) == 1 and events[-1].final
    tokens = [e for e in events if e.token is not None]
    assert [e.index for e in tokens] == list(range(len(tokens)))


def skippy_tasks() -> list[str]:
    """Names of the engine's actor tasks still alive anywhere in this trio run."""
    names, stack = [], [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return [n for n in names if n.startswith("skippy.")]


# -- a failing step ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["decode", "sampling"])
async def test_a_failing_step_under_load_fails_exactly_its_requests(where):
    """24 requests, 4 lanes: the step that raises (a plain RuntimeError, not one of ours) fails the
    requests it carried, as the step report lists them, with a StepFailedError naming the cause;
    every other request finishes with its solo tokens, and the engine serves on."""
    rt = FakeRuntime(n_ctx=1024, n_batch=16, n_seq_max=4)
    reports = []
    if where == "decode":
        def arm():
            if rt.decodes == 5:
                rt.fail_next, rt.on_decode = RuntimeError("injected kernel fault"), None

        rt.on_decode = arm
    else:
        piece, fired = rt.piece, []

        def failing_piece(token):  # called in the worker thread right after the decode, per sampled token
            if rt.decodes == 6 and not fired:
                fired.append(token)
                raise RuntimeError("injected detokenizer fault")
            return piece(token)

        rt.piece = failing_piece
    specs = [(prompt(i, 6 + i % 9), {"max_tokens": 8 + i % 5}) for i in range(24)]
    with trio.fail_after(20):
        async with open_fake_engine(rt, on_step=reports.append) as engine:
            ids: dict[int, int] = {}
            results = await consume_all(engine, specs, ids)
            after = [e async for e in engine.generate(prompt(99), max_tokens=6)]
            stats = engine.stats()
    [failed_step] = [r for r in reports if r.failed]
    in_step = set(failed_step.decode_ids) | set(failed_step.prefill_ids)
    errored = set()
    for i, ((p, kw), events) in enumerate(zip(specs, results)):
        assert_one_final_last(events)
        if events[-1].finish_reason == "error":
            errored.add(ids[i])
            assert isinstance(events[-1].error, StepFailedError)
            assert "injected" in str(events[-1].error) and isinstance(events[-1].error.__cause__, RuntimeError)
        else:
            assert [e.token for e in events if e.token is not None] == rt.solo(p, kw["max_tokens"])
    assert errored == in_step and failed_step.failed == len(in_step) > 0
    assert [e.token for e in after if e.token is not None] == rt.solo(prompt(99), 6)
    assert stats.finished["error"] == len(in_step)
    assert sum(stats.finished.values()) == stats.submitted == 25
    assert rt.ledger().components[0].used == 0


async def test_repeated_step_failures_lose_nothing_and_leak_nothing():
    """Five steps fail (two of them back to back): each request still ends exactly once (a
    completion or a StepFailedError), and every cell comes back."""
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=6)

    calls = 0

    def now_and_then():  # (rt.decodes counts successful decodes only)
        nonlocal calls
        calls += 1
        if calls in (4, 20, 21, 45, 70):
            rt.fail_next = RuntimeError(f"fault at decode call {calls}")

    rt.on_decode = now_and_then
    specs = [(prompt(i, 4 + i % 7), {"max_tokens": 5 + i % 11}) for i in range(40)]
    with trio.fail_after(20):
        async with open_fake_engine(rt) as engine:
            results = await consume_all(engine, specs)
            stats = engine.stats()
    reasons = [events[-1].finish_reason for events in results]
    for events in results:
        assert_one_final_last(events)
    assert set(reasons) == {"error", "length"} and stats.finished["error"] == reasons.count("error")
    assert sum(stats.finished.values()) == stats.submitted == 40
    assert rt.ledger().components[0].used == 0 and not rt.seqs


# -- cancelling the enclosing scope --------------------------------------------------------------


async def test_cancelling_the_enclosing_scope_mid_step_leaves_nothing_behind():
    """The engine lives in a scope a sibling cancels while a decode is in flight in the worker thread
    (it returns only when aborted) and 16 requests are running or queued: the decode is aborted,
    the worker thread is joined, no actor task is left, consumers inside the scope are cancelled and
    consumers outside it get a final "cancelled" event, none hangs."""
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    in_decode = threading.Event()

    def block_until_aborted():
        if rt.decodes >= 3:
            in_decode.set()
            deadline = time.monotonic() + 10
            while not rt.aborted and time.monotonic() < deadline:
                time.sleep(0.001)

    rt.on_decode = block_until_aborted
    before = {t.ident for t in threading.enumerate()}
    outside: dict[int, list] = {}
    inside: dict[int, str] = {}

    async def consume_outside(i, stream):
        outside[i] = [e async for e in stream]

    async def consume_inside(i, stream):
        try:
            async for _ in stream:
                pass
            inside[i] = "ended"
        except trio.Cancelled:
            inside[i] = "cancelled"
            raise

    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            with trio.CancelScope() as scope:
                async with open_fake_engine(rt) as engine:
                    worker = engine.worker
                    async with trio.open_nursery() as inner:
                        for i in range(4):
                            inner.start_soon(consume_inside, i, engine.generate(prompt(i), max_tokens=50))
                        for i in range(12):
                            outer.start_soon(consume_outside, i, engine.generate(prompt(10 + i), max_tokens=50))
                        while not in_decode.is_set():
                            await trio.sleep(0.001)
                        t_cancel = time.monotonic()
                        scope.cancel()
                        await trio.sleep_forever()
            shutdown = time.monotonic() - t_cancel
        assert scope.cancelled_caught
        assert skippy_tasks() == []
    assert rt.aborted and rt.closed and shutdown < 2
    assert not worker.alive and {t.ident for t in threading.enumerate()} <= before
    assert inside == {i: "cancelled" for i in range(4)}
    assert sorted(outside) == list(range(12))
    for events in outside.values():
        assert_one_final_last(events)
        assert events[-1].finish_reason == "cancelled"
    with pytest.raises(skippy.EngineClosedError):
        engine.generate([1], max_tokens=1)


# -- prefix sharing when the shared source is cancelled ------------------------------------------


async def test_cancelling_the_source_of_a_shared_prefix_fails_nobody():
    """Two requests wait to copy a prefix from a source still prefilling it; the source is cancelled.
    They used to re-match each other (cells only promised on both sides) and wait forever, until the
    loop failed one with NoKvSlotError in an empty pool (8 HTTP 500s in the N=256 server stress run)."""
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=12, prefix=True)
    system = [(7 * k) % 60 + 1 for k in range(32)]  # two 16-token blocks every prompt below starts with
    source: list = []

    def cancel_source_mid_prefill(report) -> None:
        if source and source[0].request.cached >= 16:  # it holds one block of the shared two
            source.pop().cancel()

    with trio.fail_after(10):
        async with open_fake_engine(rt, on_step=cancel_source_mid_prefill) as engine:
            await consume_all(engine, [([(3 * k) % 50 + 5 for k in range(40)], {"max_tokens": 2})])
            assert engine.stats().prefix_entries == 1  # an unrelated resident prefix
            source.append(engine.generate(system + [1, 2, 3, 4, 5, 6, 7, 8], max_tokens=4))
            specs = [(system + [9, 10, 11, 12, 13], {"max_tokens": 4}), (system + [14, 15, 16, 17, 18, 19],
                                                                         {"max_tokens": 4})]
            results = await consume_all(engine, specs)
            stats = engine.stats()
    assert stats.finished["cancelled"] == 1
    for (p, kw), events in zip(specs, results):
        assert events[-1].finish_reason == "length", events[-1]
        assert [e.token for e in events if e.token is not None] == rt.solo(p, kw["max_tokens"])


# -- the server: a client that leaves while its body is being read ---------------------------------


@pytest.mark.server
async def test_a_client_that_hangs_up_mid_upload_is_not_a_server_error():
    from loguru import logger

    from skippy.server import create_app, serve_app

    errors: list[str] = []
    logger.enable("skippy")
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR")
    try:
        with trio.fail_after(10):
            async with open_fake_engine(FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=2)) as engine:
                app = create_app(engine, model_names=["m"])
                async with trio.open_nursery() as nursery:
                    [url] = (await nursery.start(partial(serve_app, app, "127.0.0.1", 0)))[:1]
                    host, port = url.removeprefix("http://").rsplit(":", 1)
                    stream = await trio.open_tcp_stream(host, int(port))
                    await stream.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
                                          b'{"model": "m", "prompt": ')
                    await trio.sleep(0.2)  # the handler is now waiting for the rest of the body
                    await stream.aclose()
                    await trio.sleep(0.3)
                    nursery.cancel_scope.cancel()
    finally:
        logger.remove(sink)
        logger.disable("skippy")
    assert not any("ClientDisconnect" in e for e in errors)
    assert errors == []


@pytest.mark.server
def test_the_server_keeps_idle_connections_longer_than_its_clients_do():
    import httpx

    from skippy.server.serve import hypercorn_config

    assert hypercorn_config("127.0.0.1", 8080).keep_alive_timeout > httpx.Limits().keepalive_expiry


@pytest.mark.server
async def test_connections_closed_by_clients_are_released():
    """hypercorn 0.18's trio worker kept a connection its client closed in CLOSE-WAIT until the
    keep-alive timeout (100 one-request connections left 71 open; the N=256 server run's fds grew
    9 -> 529); skippy.server._hypercorn_trio closes it when the client's EOF arrives."""
    import os

    from skippy.server import create_app, serve_app

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with trio.fail_after(20):
        async with open_fake_engine(FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=2)) as engine:
            app = create_app(engine, model_names=["m"])
            async with trio.open_nursery() as nursery:
                [url] = (await nursery.start(partial(serve_app, app, "127.0.0.1", 0)))[:1]
                host, port = url.removeprefix("http://").rsplit(":", 1)
                before = open_fds()
                body = b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}'
                for _ in range(40):  # one request per connection, then the client closes it
                    stream = await trio.open_tcp_stream(host, int(port))
                    await stream.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                          b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    answer = b""
                    while b'"usage"' not in answer:
                        answer += await stream.receive_some(4096)
                    assert answer.startswith(b"HTTP/1.1 200")
                    await trio.sleep(0.02)  # the server is done with the request: the connection idles
                    await stream.aclose()
                await trio.sleep(0.5)
                held = open_fds() - before
                nursery.cancel_scope.cancel()
    assert held < 5, f"{held} server sockets still open after their clients closed them"
