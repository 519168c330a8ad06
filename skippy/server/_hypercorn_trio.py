"""Two changes to hypercorn's trio TCPServer: closing on the client's EOF, and the uncontended write.

**EOF.** hypercorn 0.18's trio TCPServer reads the client's EOF and then keeps the connection, in
CLOSE-WAIT, until its keep-alive timer runs out: the timer task keeps the connection's task
group alive (the trio side of pgjones/hypercorn PR #87). Under load that piles up open file
descriptors (stress/server_run: 9 -> 529 over six N=256 rounds). Here the timer also ends
when the client's EOF arrives, so an idle connection whose client left is closed at once;
one still answering a request is closed when the answer is done.

**The uncontended write.** `protocol_send` takes the connection's send lock with `async with`:
trio's Lock.acquire yields to the scheduler even when the lock is free, so every streamed token
paid one more run-loop turn (an epoll call, every task frame of the ASGI stack resumed): 71 of the
event loop's 622 Python calls per token at N=1 (bench/results/n1-lean-path). Here a free lock is
taken without that yield, and on a plain TCP socket the bytes go out with one non-blocking
write(2) (`_send_now`): trio's `send_all` yields once more after a send that completed, another
turn per token. Only what the socket does not take at once goes through `send_all` (which waits
for it to drain, yielding). A cancelled caller still raises before writing
(`checkpoint_if_cancelled`), and a held lock is waited for as before, so writes stay whole and in
order.

This replaces three *private* methods of `hypercorn.trio.tcp_server.TCPServer`, so it is not
applied at import: `serve_app` calls `install()`, which patches only the hypercorn versions
whose `TCPServer` internals it was written and checked against (`KNOWN_VERSIONS`: 0.17.0
through 0.18.0 have the same `run` / `_read_data` / `_idle_timeout` / `_initiate_server_close` /
`protocol_send`), and only when the attributes it replaces and calls are there; otherwise it logs a
warning and leaves hypercorn alone (connections then linger in CLOSE-WAIT until
`keep_alive_timeout`, and each write yields once more). pyproject.toml bounds hypercorn to the
same range.

When to drop the EOF part: once pgjones/hypercorn PR #87 (end the trio idle-timeout task when the
client's EOF is read) is in a release, require that release in pyproject.toml and drop it;
tests/test_faults.py's `test_connections_closed_by_clients_are_released` checks the behaviour
either way.
"""

from __future__ import annotations

import contextvars
import importlib.metadata
import os
import re
from typing import Any

import trio
from loguru import logger

# [lowest, highest) hypercorn versions whose trio TCPServer this patch matches (checked against
# the 0.17.0, 0.17.3 and 0.18.0 sources); keep in step with the bound in pyproject.toml
KNOWN_VERSIONS = ((0, 17), (0, 19))
_REPLACED = ("_read_data", "_idle_timeout", "protocol_send")
_CALLED = ("_initiate_server_close",)
_MARK = "_skippy_patched"
# the TCPServer whose connection the current task serves: set in its reading task, so the app task
# that hypercorn spawns from there (trio copies the spawner's context) sees it (server._inline_writes)
CONNECTION: contextvars.ContextVar[Any] = contextvars.ContextVar("skippy_connection", default=None)


def _version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _peer_gone(server: Any) -> trio.Event:
    event = getattr(server, "_skippy_peer_gone", None)
    if event is None:
        event = server._skippy_peer_gone = trio.Event()
    return event


def _patched(original_read_data: Any) -> tuple[Any, Any]:
    async def _read_data(self: Any) -> None:
        CONNECTION.set(self)
        try:
            await original_read_data(self)
        finally:
            _peer_gone(self).set()

    async def _idle_timeout(self: Any) -> None:
        gone = _peer_gone(self)
        with trio.move_on_after(self.config.keep_alive_timeout):
            async with trio.open_nursery() as nursery:
                async def terminated() -> None:
                    await self.context.terminated.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(terminated)
                await gone.wait()
                nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

    return _read_data, _idle_timeout


def _uncontended_write(original_send: Any) -> Any:
    from hypercorn.events import Closed, RawData

    async def protocol_send(self: Any, event: Any) -> None:
        lock = self.send_lock
        if not isinstance(event, RawData) or lock.locked():
            return await original_send(self, event)
        await trio.lowlevel.checkpoint_if_cancelled()  # what Lock.acquire checks first
        lock.acquire_nowait()  # free: no other task can take it before this line (no yield since the test)
        try:
            try:
                data = event.data
                sent = _send_now(self.stream, data)
                if sent < len(data):
                    with trio.CancelScope(shield=True):
                        await self.stream.send_all(memoryview(data)[sent:])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
        finally:
            lock.release()

    return protocol_send


def _send_now(stream: Any, data: bytes) -> int:
    """Write what the socket takes now, without a yield: the bytes sent (0 when it would block, or
    when `stream` is not a plain open trio SocketStream, e.g. TLS). trio's own send yields after
    every successful send, one more run-loop turn per streamed token (every frame of the ASGI stack
    resumed) for a write that had already completed. A peer that is gone raises
    BrokenResourceError, as trio's send_all would."""
    if type(stream) is not trio.SocketStream or stream.socket.did_shutdown_SHUT_WR:
        return 0
    fd = stream.socket.fileno()
    if fd < 0:
        return 0  # closed: send_all raises ClosedResourceError
    try:
        return os.write(fd, data)  # write(2) on a connected socket is send(2) without flags
    except BlockingIOError:
        return 0
    except OSError as exc:  # EPIPE (SIGPIPE is ignored by Python), ECONNRESET, ...
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


def install() -> bool:
    """Patch hypercorn's trio TCPServer once per process; True when the patch is in place.

    Idempotent (a second call sees the mark and does nothing). Refuses, with a warning, on a
    hypercorn outside `KNOWN_VERSIONS` or one whose TCPServer lacks the private methods."""
    try:
        from hypercorn.trio.tcp_server import TCPServer
    except ImportError as exc:
        logger.warning("hypercorn's trio worker not importable ({}): not patching its EOF handling", exc)
        return False
    if getattr(TCPServer, _MARK, False):
        return True
    try:
        version = importlib.metadata.version("hypercorn")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    parsed = _version_tuple(version)
    low, high = KNOWN_VERSIONS
    if parsed is None or not (low <= parsed < high):
        logger.warning("hypercorn {} is outside the versions skippy's CLOSE-WAIT fix was written for "
                       "(>={}, <{}): not patching; connections their clients closed may stay open "
                       "until keep_alive_timeout", version, ".".join(map(str, low)), ".".join(map(str, high)))
        return False
    missing = [name for name in _REPLACED + _CALLED if not callable(getattr(TCPServer, name, None))]
    if missing:
        logger.warning("hypercorn {}'s trio TCPServer has no {}: not patching its EOF handling",
                       version, ", ".join(missing))
        return False
    TCPServer._read_data, TCPServer._idle_timeout = _patched(TCPServer._read_data)
    TCPServer._skippy_original_protocol_send = TCPServer.protocol_send
    TCPServer.protocol_send = _uncontended_write(TCPServer.protocol_send)
    setattr(TCPServer, _MARK, True)
    return True
