"""Actor plumbing: request/reply over trio memory channels, and delivering events to callers."""

from __future__ import annotations

from typing import Any, TypeVar

import trio
from loguru import logger

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


class Tap:
    """A request's sink while its reader takes events inline (GenerationStream.divert).

    While `armed` (set by the reader just before it waits, with nothing queued), each event but the
    last goes to `take` in the step that produced it, and the reader's task is never woken for it.
    An event `take` refuses, and every one after it until the reader waits again with nothing
    queued, goes to the channel as before: each event is taken or queued once, in order. `take`
    must not raise; if it does, the tap stays disarmed for good (logged) and every event queues.
    """

    def __init__(self, take: Any, channel: trio.MemorySendChannel) -> None:
        self.take, self.channel, self.armed = take, channel, False

    def send_nowait(self, event: Any) -> None:
        if self.armed and not event.final:
            try:
                if self.take(event):
                    return
            except Exception:
                logger.opt(exception=True).error("an inline event reader failed; its events queue from now on")
                self.take = None
        self.armed = False
        self.channel.send_nowait(event)

    def offer(self, event: Any) -> bool:
        """`take` the event if armed (True), else leave it to the caller (False), the channel untouched:
        what a run ahead calls on the worker thread, where a trio channel must not be sent to."""
        take = self.take
        if not self.armed or take is None or event.final:
            return False
        try:
            if take(event):
                return True
        except Exception:
            logger.opt(exception=True).error("an inline event reader failed; its events queue from now on")
            self.take = None
        self.armed = False  # refused: it and the events behind it queue, as through send_nowait
        return False

    def close(self) -> None:
        self.channel.close()
