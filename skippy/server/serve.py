"""Serving the app with hypercorn's trio worker, and graceful shutdown.

`serve_app` runs inside the caller's nursery (`await nursery.start(serve_app, app, ...)`
returns the bound addresses). When `shutdown_trigger` returns: new requests get 503,
in-flight ones may finish until the deadline, the rest are cancelled (their cells freed at
the next step), then hypercorn stops and `serve_app` returns. Requests are bounded by
`limits.HttpLimits` (body size, header size, requests per connection).
"""

from __future__ import annotations

import logging
import signal
from functools import partial
from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from loguru import logger

from . import _hypercorn_eof
from .app import ServerState
from .limits import HttpLimits, RequestLimits


def hypercorn_config(host: str, port: int, *, graceful_timeout: float = 5.0,
                     limits: HttpLimits | None = None) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    # hypercorn's own errors (an exception that escaped the app, a failed send) reach loguru at
    # ERROR; its INFO lines (the address: we print it ourselves) stay out
    config.errorlog = _errorlog()
    config.graceful_timeout = graceful_timeout
    (limits or HttpLimits()).apply(config)
    # longer than clients keep idle connections (httpx and openai: 5 s), so a client reusing one
    # never races the server closing it (a POST is not retried on 'disconnected without a response')
    config.keep_alive_timeout = 75.0
    return config


class _ToLoguru(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelname if record.levelno >= logging.WARNING else "DEBUG"
        logger.opt(depth=1, exception=record.exc_info).log(level, "hypercorn: {}", record.getMessage())


def _errorlog() -> logging.Logger:
    log = logging.getLogger("skippy.hypercorn")
    if not log.handlers:
        log.addHandler(_ToLoguru())
        log.propagate = False
        log.setLevel(logging.WARNING)
    return log


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
    limits: HttpLimits | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until `shutdown_trigger` returns (default: never; cancel the scope to stop hard).
    `limits` bound what one client may make the server hold (default: HttpLimits())."""
    state: ServerState = app.state.server
    # close connections their clients closed at once, not after keep_alive_timeout in CLOSE-WAIT;
    # version-guarded and idempotent (see _hypercorn_eof: goes once pgjones/hypercorn PR #87 ships)
    _hypercorn_eof.install()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        limits = limits or HttpLimits()
        binds = await nursery.start(partial(hypercorn_serve, RequestLimits(app, limits),
                                            hypercorn_config(host, port, limits=limits), shutdown_trigger=stop.wait))
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
