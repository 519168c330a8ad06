"""HTTP limits in front of the app: what one client may make the server hold.

The handlers read a whole request body into memory before parsing it, so without a bound a
client could make the server buffer (and JSON-parse) gigabytes. `RequestLimits` answers a body over
`max_body_bytes` with 413 and OpenAI's error body *before* reading it: at once from its
Content-Length, and for a chunked upload as soon as the bytes received pass the limit (the rest
is never read; the connection is closed after the answer), and headers over `max_header_bytes`
with 431. Requests per keep-alive connection and HTTP/2 stream limits are hypercorn's own
settings (`HttpLimits.apply`), as is the bound on headers still arriving (h11's incomplete size).
"""

from __future__ import annotations

from ..errors import InvalidInputError

from typing import Any

import attrs
import trio
from starlette.responses import JSONResponse

from .api_errors import ApiError

DEFAULT_MAX_BODY_BYTES = 8 << 20  # a 128-prompt token-id batch is ~1 MiB of JSON; leave room


@attrs.frozen
class HttpLimits:
    """What one client may make the server hold; hypercorn enforces all but the body's."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = 16 << 10  # request line + headers: past it, 431
    max_requests_per_connection: int = 1000  # then the keep-alive connection is closed
    h2_max_concurrent_streams: int = 64
    h2_max_header_list_size: int = 16 << 10

    def __attrs_post_init__(self) -> None:
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"HttpLimits.{field.name} must be a positive integer, got {value!r}")

    def apply(self, config: Any) -> None:
        """Set hypercorn's own limits on its Config."""
        config.h11_max_incomplete_size = self.max_header_bytes
        config.keep_alive_max_requests = self.max_requests_per_connection
        config.h2_max_concurrent_streams = self.h2_max_concurrent_streams
        config.h2_max_header_list_size = self.h2_max_header_list_size


class BodyTooLarge(ApiError):
    """A request body over the limit (413). Raised from `receive`, so the app's ApiError handler
    answers it; RequestLimits answers it itself when it reaches the middleware."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The request body is larger than this server accepts ({limit} bytes)",
                         code="request_too_large", headers={"Connection": "close"})


def headers_too_large(limit: int) -> ApiError:
    return ApiError(431, f"The request headers are larger than this server accepts ({limit} bytes)",
                    code="request_headers_too_large", headers={"Connection": "close"})


def _content_length(scope: Any) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP layer refuses these before the app; be safe anyway
    return None


def _header_bytes(scope: Any) -> int:
    return sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))  # "name: value\r\n"


class RequestLimits:
    """ASGI middleware: headers of at most `limits.max_header_bytes` (431; hypercorn's own bound is
    only on headers still arriving) and bodies of at most `limits.max_body_bytes` (413).

    It also reads what is left of a body the app answered without reading (a 404, a 405, a GET
    with a body) before the answer goes out: hypercorn closes a connection whose request was not
    read to its end when the answer is done, without saying `Connection: close`, and the
    client's next request on it would fail with no answer. If that body cannot be read (over the
    limit, or not within DRAIN_S), the answer says `Connection: close` instead."""

    DRAIN_S = 5.0

    def __init__(self, app: Any, limits: HttpLimits | None = None) -> None:
        self.app = app
        self.limits = limits or HttpLimits()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        if _header_bytes(scope) > self.limits.max_header_bytes:
            await _answer(headers_too_large(self.limits.max_header_bytes), scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > limit:
            await _answer(BodyTooLarge(limit), scope, receive, send)
            return
        body = _BodyReader(receive, limit)

        async def watched_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                body.started = True
                if not body.done and not await body.drain(self.DRAIN_S):
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, body.receive, watched_send)
        except BodyTooLarge as exc:
            if not body.started:  # else the answer is already under way: the server closes the connection
                await _answer(exc, scope, receive, send)


class _BodyReader:
    """`receive` that counts the body against the limit and knows when it has all been read."""

    def __init__(self, receive: Any, limit: int) -> None:
        self._receive, self._limit = receive, limit
        self.received = 0
        self.done = False  # the body's last message was received (or the client left)
        self.over = False
        self.started = False  # the answer began

    async def receive(self) -> Any:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.done = not message.get("more_body", False)
            if self.received > self._limit:
                self.over = True
                raise BodyTooLarge(self._limit)
        elif message["type"] == "http.disconnect":
            self.done = True
        return message

    async def drain(self, timeout: float) -> bool:
        """Read and drop the rest of the body; False if it is over the limit or too slow to come."""
        if self.over:
            return False
        with trio.move_on_after(timeout):
            try:
                while not self.done:
                    await self.receive()
            except BodyTooLarge:
                return False
            return True
        return False


async def _answer(err: ApiError, scope: Any, receive: Any, send: Any) -> None:
    await JSONResponse(err.body(), status_code=err.status, headers=err.headers)(scope, receive, send)
