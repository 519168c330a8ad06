"""Close a keep-alive connection as soon as its client has closed it (hypercorn's trio worker).

hypercorn 0.18's trio TCPServer reads the client's EOF and then keeps the connection, in
CLOSE-WAIT, until its keep-alive timer runs out: the timer task keeps the connection's task
group alive (the trio side of pgjones/hypercorn PR #87). Under load that piles up open file
descriptors (stress/server_run: 9 -> 529 over six N=256 rounds). Here the timer also ends
when the client's EOF arrives, so an idle connection whose client left is closed at once;
one still answering a request is closed when the answer is done.
"""

from __future__ import annotations

import trio
from hypercorn.trio.tcp_server import TCPServer

_original_read_data = TCPServer._read_data


def _peer_gone(server: TCPServer) -> trio.Event:
    event = getattr(server, "_skippy_peer_gone", None)
    if event is None:
        event = server._skippy_peer_gone = trio.Event()
    return event


async def _read_data(self: TCPServer) -> None:
    try:
        await _original_read_data(self)
    finally:
        _peer_gone(self).set()


async def _idle_timeout(self: TCPServer) -> None:
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


def install() -> None:
    """Idempotent: patch the two methods once per process."""
    if getattr(TCPServer, "_skippy_eof_closes", False):
        return
    TCPServer._read_data = _read_data
    TCPServer._idle_timeout = _idle_timeout
    TCPServer._skippy_eof_closes = True
