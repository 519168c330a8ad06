"""A live server on loopback inside the test's own nursery, and clients for it."""

from __future__ import annotations

import re
from contextlib import asynccontextmanager
from functools import partial

import trio

import skippy
from skippy.server import create_app, serve_app

ENGINE = dict(n_ctx=1024, n_batch=64, threads=1)


@asynccontextmanager
async def live_server(model, *, shutdown_trigger=None, deadline=30.0, names=None, **engine_options):
    """(url, app, engine): an engine and the app served on an ephemeral loopback port; torn down on exit."""
    async with skippy.open_engine(model, **{**ENGINE, **engine_options}) as engine:
        app = create_app(engine, model_names=names or ["test-model"])
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve_app, app, "127.0.0.1", 0, shutdown_trigger=shutdown_trigger,
                                                deadline=deadline))
            yield binds[0], app, engine
            nursery.cancel_scope.cancel()


async def wait_healthy(http) -> None:
    """Poll /health on an httpx.AsyncClient until a server process started by the test answers 200
    (the caller's fail_after bounds it)."""
    import httpx

    while True:
        try:
            if (await http.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await trio.sleep(0.1)


def openai_client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


async def in_thread(fn, *args, **kwargs):
    """The openai client is sync here: run it off the trio loop (abandoned if the test times out)."""
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs), abandon_on_cancel=True)


def metric(text: str, name: str, labels: str = "") -> float:
    """One sample's value from Prometheus text, e.g. metric(t, 'skippy_kv_used_cells', 'component="attn"')."""
    pattern = "^" + re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)$"
    m = re.search(pattern, text, re.M)
    assert m, f"{name}{{{labels}}} not in /metrics"
    return float(m.group(1))
