"""Starting and stopping: inside the test's own nursery, graceful drain, the deadline, and `skippy serve` signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from contextlib import aclosing
from functools import partial

import httpx
import pytest
import trio

import skippy
from skippy.server import create_app, serve_app

from ._live import live_server, wait_healthy

pytestmark = pytest.mark.server

M = "test-model"
LONG = {"model": M, "prompt": "tell me everything", "ignore_eos": True}


async def _post(http: httpx.AsyncClient, body: dict) -> tuple[int, str]:
    async with http.stream("POST", "/v1/completions", json=body) as r:
        return r.status_code, (await r.aread()).decode()


def _sse(raw: str) -> list[str]:
    return [line[6:] for line in raw.splitlines() if line.startswith("data: ")]


async def test_app_runs_inside_the_tests_own_nursery_and_cancels_cleanly(synth_model_path):
    with trio.fail_after(30):
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=512, n_batch=64, threads=1) as engine:
            app = create_app(engine, model_names=[M])
            async with trio.open_nursery() as nursery:
                (url,) = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
                async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                    r = await http.post("/v1/completions", json={"model": M, "prompt": "hi", "max_tokens": 3})
                    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
                nursery.cancel_scope.cancel()
            port = int(url.rsplit(":", 1)[1])
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)  # nothing listens any more
            assert engine.stats().running == 0


async def test_graceful_shutdown_refuses_new_work_and_finishes_in_flight(synth_model_path):
    stop = trio.Event()
    results: dict[str, tuple[int, str]] = {}
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama"), shutdown_trigger=stop.wait, deadline=30,
                               n_seq_max=4) as (url, app, engine):
            state = app.state.server
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                async with trio.open_nursery() as nursery:
                    for name, stream in (("s1", True), ("s2", True), ("full", False)):
                        async def go(name=name, stream=stream):
                            results[name] = await _post(http, {**LONG, "max_tokens": 48, "stream": stream})
                        nursery.start_soon(go)
                    while len(state.in_flight) < 3 or engine.stats().output_tokens < 3:
                        await trio.sleep(0.01)
                    stop.set()
                    while not state.draining:
                        await trio.sleep(0.005)
                    async with httpx.AsyncClient(base_url=url, timeout=10) as fresh:
                        refused = await fresh.post("/v1/completions", json={**LONG, "max_tokens": 2})
                        health = await fresh.get("/health")
                    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
                    assert health.status_code == 503
            with trio.fail_after(15):  # serve_app returns by itself once drained
                while state.in_flight or not app.state.server.draining:
                    await trio.sleep(0.01)
    for name in ("s1", "s2"):
        status, raw = results[name]
        events = _sse(raw)
        assert status == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    status, raw = results["full"]
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 48


async def test_shutdown_deadline_cancels_what_is_left_and_serve_returns(synth_model_path):
    stop = trio.Event()
    results: dict[str, tuple[int, str]] = {}
    returned = trio.Event()
    with trio.fail_after(60):
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=1024, n_batch=64, threads=1) as engine:
            app = create_app(engine, model_names=[M])
            state = app.state.server
            async with trio.open_nursery() as nursery:
                async def serve(task_status=trio.TASK_STATUS_IGNORED):
                    await serve_app(app, "127.0.0.1", 0, shutdown_trigger=stop.wait, deadline=0.3,
                                    task_status=task_status)
                    returned.set()
                (url,) = await nursery.start(serve)
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    async with trio.open_nursery() as clients:
                        for name, stream in (("stream", True), ("full", False)):
                            async def go(name=name, stream=stream):
                                results[name] = await _post(http, {**LONG, "max_tokens": 900, "stream": stream})
                            clients.start_soon(go)
                        while len(state.in_flight) < 2 or engine.stats().output_tokens < 2:
                            await trio.sleep(0.01)
                        stop.set()
                await returned.wait()  # serve_app returned on its own: no cancel from us
            while engine.stats().kv_used[skippy.kv.ComponentKind.ATTN] > engine.stats().prefix_resident_tokens:
                await trio.sleep(0.01)  # every lane freed; only the resident prefix cache keeps cells
            stats = engine.stats()
    status, raw = results["stream"]
    events = _sse(raw)
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    status, raw = results["full"]
    assert status == 503 and json.loads(raw)["error"]["code"] == "shutting_down"
    assert stats.finished["cancelled"] == 2 and stats.output_tokens < 1800


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_skippy_serve_exits_0_on_signal_after_finishing_in_flight(signum, synth_model_path):
    synth_model_path("llama")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippy", "serve", "--family", "llama", "--port", str(port), "--threads", "1",
         "--n-ctx", "512", "--shutdown-deadline", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "SKIPPY_NATIVE": os.environ.get("SKIPPY_NATIVE", "1")})
    try:
        with trio.fail_after(45):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                await wait_healthy(http)
                assert (await http.get("/v1/models")).json()["data"][0]["id"] == "llama-s0-v1"
                async with http.stream("POST", "/v1/completions",
                                       json={"model": "llama", "prompt": "hi", "max_tokens": 40, "ignore_eos": True,
                                             "stream": True}) as r:
                    async with aclosing(r.aiter_lines()) as lines:
                        async for line in lines:
                            if line.startswith("data: "):
                                break
                        proc.send_signal(signum)  # mid-stream
                        rest = [line async for line in lines if line.startswith("data: ")]
                assert rest[-1] == "data: [DONE]"
                assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
            rc = await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
        out = proc.stdout.read()
        proc.stdout.close()
        assert rc == 0, out
        assert "serving llama-s0-v1" in out and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if not proc.stdout.closed:
            proc.stdout.close()
