"""A text/event-stream response: starlette's StreamingResponse run in one trio nursery.

The app frames its events itself (protocol.sse_event, the per-choice text encoders), keeps no
pings, and drains on shutdown through the engine, so what sse-starlette adds around each write
(a timeout cancel scope per send, an exit-signal watcher, a debug log call) is per-token work
with nothing to do: about 40 Python calls per streamed token on the event loop, whose CPU a
2-core box takes from ggml's compute threads (bench/results/n1-lean-path). What it keeps:
the client's disconnect cancels the body generator (its `finally` cancels the requests), an
optional feeder task runs beside the body (several prompts streamed into one response), and
a body generator left suspended at a `yield` by a failed or cancelled write is closed before
the response returns. A disconnect once the body's end is being sent is not the client's: hypercorn
says it to the app while it closes a connection that must close (HTTP/1.0, `Connection: close`)
inside that last send, and cancelling then left the connection open, so such a client, which reads
to the close, waited forever.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import trio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send


CLOSE_DEADLINE_S = 5.0  # a body generator's cleanup is synchronous; this only bounds a mistake


class EventStream(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], *, headers: Mapping[str, str] | None = None,
                 feeder: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})})
        self.feeder = feeder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ending = False

        async def send_marking_the_end(message: Message) -> None:
            nonlocal ending
            ending = ending or not message.get("more_body", True)
            await send(message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cancel_on_disconnect, receive, nursery.cancel_scope, lambda: ending)
            if self.feeder is not None:
                nursery.start_soon(self.feeder)
            try:
                await self.stream_response(send_marking_the_end)
            finally:
                await _close(self.body_iterator)
            nursery.cancel_scope.cancel()  # the body is done: the watcher and the feeder end with it

    async def _cancel_on_disconnect(self, receive: Receive, scope: trio.CancelScope,
                                    ending: Callable[[], bool]) -> None:
        await self.listen_for_disconnect(receive)  # starlette's: returns on http.disconnect
        if not ending():  # past the body's end, the server itself says "disconnect" while it closes the
            scope.cancel()  # connection (HTTP/1.0, Connection: close) inside our last send: let it finish


async def _close(body: Any) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_DEADLINE_S):
            await aclose()
