"""The port is bound before the model loads: 503 (loading) until the app is there (server.loading)."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
import trio

import skippy
from skippy.server import LoadingGate, create_app, serve_app

pytestmark = pytest.mark.server


async def test_every_route_answers_503_while_loading_then_the_app_serves(synth_model_path):
    gate = LoadingGate()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            (url,) = await nursery.start(partial(serve_app, gate, "127.0.0.1", 0))
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                health = await http.get("/health")
                assert health.status_code == 503 and health.json() == {"status": "loading"}
                assert health.headers["retry-after"] == "1"
                refused = await http.post("/v1/completions", json={"model": "m", "prompt": "hi"})
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "loading"
                async with skippy.open_engine(synth_model_path("llama"), n_ctx=512, n_batch=64, threads=1) as engine:
                    gate.open(create_app(engine, model_names=["m"]))
                    assert (await http.get("/health")).status_code == 200
                    r = await http.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
                    assert r.status_code == 200
                    nursery.cancel_scope.cancel()


async def test_a_shutdown_while_loading_stops_at_once():
    stop = trio.Event()
    returned = trio.Event()
    gate = LoadingGate()

    async def serve(task_status=trio.TASK_STATUS_IGNORED):
        await serve_app(gate, "127.0.0.1", 0, shutdown_trigger=stop.wait, task_status=task_status)
        returned.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            stop.set()
            await returned.wait()  # nothing to drain: serve_app returns by itself
