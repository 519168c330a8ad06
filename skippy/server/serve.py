"""Serving the app with hypercorn's trio worker, and graceful shutdown.

`serve_app` runs inside the caller's nursery (`await nursery.start(serve_app, app, ...)`
returns the bound addresses). When `shutdown_trigger` returns: new requests get 503,
in-flight ones may finish until the deadline, the rest are cancelled (their cells freed at
the next step), then hypercorn stops and `serve_app` returns. Requests are bounded by
`limits.HttpLimits` (body size, header size, requests per connection). With `certfile` and
`keyfile` it serves HTTPS only (hypercorn's TLS: 1.2 or newer, ALPN h2 and http/1.1).
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
from functools import partial
from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from loguru import logger

from ..errors import SkippyError
from . import _hypercorn_trio
from .app import ServerState
from .limits import HttpLimits, RequestLimits

TLS_HANDSHAKE_TIMEOUT_S = 10.0  # hypercorn's default (60 s) lets a silent client hold a connection longer


class TLSConfigError(SkippyError):
    """The API's TLS certificate or key cannot be loaded (or only one of them is given)."""


def hypercorn_config(host: str, port: int, *, graceful_timeout: float = 5.0,
                     limits: HttpLimits | None = None, certfile: os.PathLike[str] | str | None = None,
                     keyfile: os.PathLike[str] | str | None = None) -> Config:
    config = Config()
    if check_tls_files(certfile, keyfile):
        config.certfile, config.keyfile = os.fspath(certfile), os.fspath(keyfile)
        config.ssl_handshake_timeout = TLS_HANDSHAKE_TIMEOUT_S
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


def check_tls_files(certfile: os.PathLike[str] | str | None, keyfile: os.PathLike[str] | str | None) -> bool:
    """Whether TLS is on; a certificate and key that do not load fail here with a one-line
    reason, before anything is bound (hypercorn would fail later, with less to say)."""
    if certfile is None and keyfile is None:
        return False
    if certfile is None or keyfile is None:
        raise TLSConfigError("a TLS certificate and its key go together (--tls-cert, --tls-key): give both or neither")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ValueError) as exc:
        why = (exc.reason or str(exc)) if isinstance(exc, ssl.SSLError) else getattr(exc, "strerror", None) or str(exc)
        raise TLSConfigError(f"cannot load the TLS certificate {str(certfile)!r} with the key {str(keyfile)!r}: "
                             f"{why}") from None
    return True


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
    certfile: os.PathLike[str] | str | None = None,
    keyfile: os.PathLike[str] | str | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until `shutdown_trigger` returns (default: never; cancel the scope to stop hard).
    `limits` bound what one client may make the server hold (default: HttpLimits()). With
    `certfile` and `keyfile` (PEM) it serves HTTPS; the bound addresses then start 'https://'. `app` may
    be a LoadingGate (server.loading): what is drained is the state of the app it holds at shutdown."""
    # close connections their clients closed at once, not after keep_alive_timeout in CLOSE-WAIT;
    # version-guarded and idempotent (see _hypercorn_trio: goes once pgjones/hypercorn PR #87 ships)
    _hypercorn_trio.install()
    stop = trio.Event()
    limits = limits or HttpLimits()
    config = hypercorn_config(host, port, limits=limits, certfile=certfile, keyfile=keyfile)  # a bad cert fails here
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, RequestLimits(app, limits), config,
                                            shutdown_trigger=stop.wait))
        task_status.started(binds)
        if shutdown_trigger is None:
            await trio.sleep_forever()
        await shutdown_trigger()
        state: ServerState | None = app.state.server  # None: a LoadingGate still loading, nothing to drain
        if state is not None:
            logger.info("shutting down: draining {} in-flight request(s)", len(state.in_flight))
            await drain(state, deadline)
        stop.set()


async def wait_for_signal(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> int:
    """Return at the first SIGINT or SIGTERM (main thread only)."""
    with trio.open_signal_receiver(*signals) as received:
        async for signum in received:
            return signum
    raise AssertionError("unreachable")
