"""Serving the app with hypercorn's trio worker, and graceful shutdown.

`serve_app` runs inside the caller's nursery (`await nursery.start(serve_app, app, ...)`
returns the bound addresses). When `shutdown_trigger` returns: new requests get 503,
in-flight ones may finish until the deadline, the rest are cancelled (their cells freed at
the next step), then hypercorn stops and `serve_app` returns.
"""

from __future__ import annotations

import signal
from functools import partial
from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from loguru import logger

from . import _hypercorn_eof
from .app import ServerState


def hypercorn_config(host: str, port: int, *, graceful_timeout: float = 5.0) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # we print the address ourselves; errors reach loguru through the app
    config.graceful_timeout = graceful_timeout
    # longer than clients keep idle connections (httpx and openai: 5 s), so a client reusing one
    # never races the server closing it (a POST is not retried on 'disconnected without a response')
    config.keep_alive_timeout = 75.0
    return config


async def drain(state: ServerState, deadline: float) -> int:
    """Refuse new work (503), wait up to `deadline` s for in-flight requests, cancel the rest.

    Returns how many requests had to be cancelled."""
    state.draining = True
    with trio.move_on_after(deadline):
        await state.idle.wait()
    cancelled = state.cancel_in_flight() if state.in_flight else 0
    if cancelled:
        logger.warning("shutdown deadline ({} s) passed: cancelled {} in-flight request(s)", deadline, cancelled)
        with trio.move_on_after(2.0):  # their handlers answer at once (503 / an error chunk + [DONE])
            await state.idle.wait()
    return cancelled


async def serve_app(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    deadline: float = 30.0,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until `shutdown_trigger` returns (default: never; cancel the scope to stop hard)."""
    state: ServerState = app.state.server
    # close connections their clients closed at once, not after keep_alive_timeout in CLOSE-WAIT;
    # version-guarded and idempotent (see _hypercorn_eof: goes once pgjones/hypercorn PR #87 ships)
    _hypercorn_eof.install()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, app, hypercorn_config(host, port),
                                            shutdown_trigger=stop.wait))
        task_status.started(binds)
        if shutdown_trigger is None:
            await trio.sleep_forever()
        await shutdown_trigger()
        logger.info("shutting down: draining {} in-flight request(s)", len(state.in_flight))
        await drain(state, deadline)
        stop.set()


async def wait_for_signal(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> int:
    """Return at the first SIGINT or SIGTERM (main thread only)."""
    with trio.open_signal_receiver(*signals) as received:
        async for signum in received:
            return signum
    raise AssertionError("unreachable")
