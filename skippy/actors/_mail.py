"""Actor plumbing: request/reply over trio memory channels, and delivering events to callers."""

from __future__ import annotations

from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def call(inbox: trio.MemorySendChannel, what: Any) -> Any:
    """Ask an actor `what` (in a Call with a one-shot reply channel) and wait for its one answer."""
    from .messages import Call

    reply_tx, reply_rx = trio.open_memory_channel(1)
    async with reply_rx:
        await inbox.send(Call(what, reply_tx))
        return await reply_rx.receive()


def reply(channel: trio.MemorySendChannel, value: Any) -> None:
    """Answer a call; a caller that went away (cancelled) is not an error."""
    try:
        channel.send_nowait(value)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        pass


def deliver(sink: Any, event: Any) -> None:
    """Push an event to a request's stream without ever blocking the step loop."""
    if sink is None:
        return
    try:
        sink.send_nowait(event)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        pass
    if getattr(event, "final", False):
        sink.close()


def poke(inbox: trio.MemorySendChannel, message: Any) -> None:
    """Fire-and-forget on an unbounded inbox (used from sync code, e.g. cancellation)."""
    try:
        inbox.send_nowait(message)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        pass
