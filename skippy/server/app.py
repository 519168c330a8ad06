"""The ASGI app (Starlette, run on trio through anyio) bound to one engine.

`create_app(engine)` returns an app whose `state.server` (a ServerState) tracks in-flight
requests and the draining flag that graceful shutdown sets; everything protocol-shaped is
in `protocol`, everything Prometheus-shaped in `metrics`.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any, AsyncIterator, Sequence

import trio
from loguru import logger
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import SkippyError
from . import protocol as P
from .metrics import CONTENT_TYPE, ServerMetrics


class ServerState:
    """What the handlers share: the engine, served names, metrics, in-flight streams, draining."""

    def __init__(self, engine: Any, model_names: Sequence[str]) -> None:
        self.engine = engine
        self.model_names = list(dict.fromkeys(model_names))
        self.created = int(time.time())
        self.metrics = ServerMetrics(engine)
        self.draining = False
        self.in_flight: set[Any] = set()  # GenerationStreams not yet finished
        self.idle = trio.Event()
        self.idle.set()
        self._ids = itertools.count()

    def track(self, stream: Any) -> None:
        self.in_flight.add(stream)
        self.idle = trio.Event() if self.idle.is_set() else self.idle

    def untrack(self, stream: Any) -> None:
        self.in_flight.discard(stream)
        if not self.in_flight:
            self.idle.set()

    def cancel_in_flight(self) -> int:
        """Past the shutdown deadline: every unfinished request is cancelled (cells freed next step)."""
        n = len(self.in_flight)
        for s in list(self.in_flight):
            s.cancel()
        return n

    def request_id(self, kind: str) -> str:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _error_response(err: P.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _prompt_tokens(state: ServerState, call: P.GenerateCall) -> Any:
    """Chat messages through the GGUF's own template; completions as given (text or ids)."""
    if call.kind != "chat":
        return call.prompt
    engine = state.engine
    if not engine.has_chat_template:
        raise P.ApiError(400, "this engine has no model with a chat template", code="no_chat_template")
    try:
        return engine.chat_tokens(call.prompt)
    except SkippyError as exc:
        raise P.bad_request(str(exc), param="messages") from None


async def _generate(request: HttpRequest, kind: str) -> Response:
    state: ServerState = request.app.state.server
    if state.draining:
        raise P.shutting_down()
    try:
        body = await request.body()
    except ClientDisconnect:  # hung up before its body was complete: nobody to answer, nothing to run
        logger.debug("client left during the upload of {} {}", request.method, request.url.path)
        return Response(status_code=499)
    data = P.parse_json(body)
    call = P.parse_chat(data) if kind == "chat" else P.parse_completion(data)
    if call.model not in state.model_names:
        raise P.not_found(call.model)
    engine = state.engine
    t_arrival = time.perf_counter()
    prompt = _prompt_tokens(state, call)
    max_tokens = call.max_tokens
    if max_tokens is None:  # chat without a limit: the rest of the context
        max_tokens = P.resolve_max_tokens(call, len(prompt), engine.n_ctx)
    try:
        stream = engine.generate(prompt, **call.engine_kwargs(max_tokens))
    except (SkippyError, ValueError) as exc:
        raise P.engine_error(exc) from None
    state.track(stream)
    try:
        await stream.queued()
    except SkippyError as exc:
        state.untrack(stream)
        raise P.engine_error(exc) from None
    except BaseException:
        state.untrack(stream)
        raise
    shape = P.ResponseShape(kind, state.request_id(kind), call.model)
    if call.stream:
        return EventSourceResponse(_sse(state, stream, shape, call, t_arrival), ping=0,
                                   headers={"Cache-Control": "no-cache"})
    return await _collect(request, state, stream, shape, t_arrival)


async def _collect(request: HttpRequest, state: ServerState, stream: Any, shape: P.ResponseShape,
                   t_arrival: float) -> Response:
    """Non-streaming: gather the events; a client that hangs up cancels the request."""
    parts: list[str] = []
    final = None
    t_first = t_last = None
    n = 0

    async def watch_disconnect(scope: trio.CancelScope) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            async for event in stream:
                if event.token is not None:
                    n += 1
                    t_last = time.perf_counter()
                    t_first = t_first or t_last
                parts.append(event.text)
                if event.final:
                    final = event
            nursery.cancel_scope.cancel()
    finally:
        stream.cancel()
        state.untrack(stream)
    state.metrics.observe(t_arrival, t_first, t_last, n)
    if final is None or final.finish_reason == "cancelled":
        raise P.shutting_down()  # only shutdown ends a request whose client is still there
    if final.finish_reason == "error":
        raise P.ApiError(500, f"generation failed: {final.error}", type="server_error", code="generation_failed")
    u = final.usage
    usage = P.usage_json(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
    return JSONResponse(shape.full("".join(parts), final.finish_reason, usage))


async def _sse(state: ServerState, stream: Any, shape: P.ResponseShape, call: P.GenerateCall,
               t_arrival: float) -> AsyncIterator[bytes]:
    """Streaming: one chunk per token, usage last when asked, then [DONE]. The tokens that queued
    while the client was slow go out in one write, each once and in order. Being cancelled (the
    client left: sse-starlette cancels us) cancels the request."""
    t_first = t_last = None
    n = 0
    first = True
    encode = shape.text_event_encoder(call.include_usage)
    try:
        if call.kind == "chat":  # OpenAI opens a chat stream with the role
            yield P.sse_event(shape.chunk("", first=True, include_usage=call.include_usage))
            first = False
        while True:
            events = await stream.batch()
            if not events:  # ended without a final event: cancelled by shutdown
                yield P.sse_event(P.shutting_down().body())
                break
            now = time.perf_counter()
            out: list[bytes] = []
            final = None
            for event in events:
                if event.token is not None:
                    n += 1
                    t_last = now
                    t_first = t_first or now
                if event.final:
                    final = event
                    break
                if event.text:
                    out.append(encode(event.text, first))
                    first = False
            if final is not None:
                out += _final_events(final, shape, call, encode, first)
            if out:
                yield b"".join(out)
                if events[0].t_sampled:  # the oldest token of this write: sampled -> its bytes written
                    state.metrics.delivery.observe(time.perf_counter() - events[0].t_sampled)
            if final is not None:
                break
        yield P.sse_event("[DONE]")
    finally:
        stream.cancel()
        state.untrack(stream)
        state.metrics.observe(t_arrival, t_first, t_last, n)


def _final_events(final: Any, shape: P.ResponseShape, call: P.GenerateCall, encode: Any, first: bool) -> list[bytes]:
    if final.finish_reason in ("cancelled", "error"):
        err = (P.shutting_down() if final.finish_reason == "cancelled" else
               P.ApiError(500, f"generation failed: {final.error}", type="server_error", code="generation_failed"))
        return [P.sse_event(err.body())]
    out = [encode(final.text, first)] if final.text else []
    out.append(P.sse_event(shape.chunk("", final.finish_reason, include_usage=call.include_usage)))
    if call.include_usage:
        u = final.usage
        out.append(P.sse_event(shape.usage_chunk(P.usage_json(u.prompt_tokens, u.completion_tokens, u.cached_tokens))))
    return out


# -- routes ---------------------------------------------------------------------------------


async def completions(request: HttpRequest) -> Response:
    return await _generate(request, "completion")


async def chat_completions(request: HttpRequest) -> Response:
    return await _generate(request, "chat")


async def models(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse(P.models_json(state.model_names, state.created))


async def health(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    if state.draining:
        return JSONResponse({"status": "shutting_down"}, status_code=503)
    s = state.engine.stats()
    return JSONResponse({"status": "ok", "running": s.running, "waiting": s.waiting})


async def metrics(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


async def _api_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, P.ApiError)
    return _error_response(exc)


async def _http_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(P.error_body(str(exc.detail), kind), status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: HttpRequest, exc: Exception) -> Response:
    logger.opt(exception=exc).error("unhandled error in {} {}", request.method, request.url.path)
    return JSONResponse(P.error_body("internal server error", "server_error"), status_code=500)


def default_model_names(engine: Any, aliases: Sequence[str] = ()) -> list[str]:
    """The served model's id: its file name without .gguf, plus any aliases (e.g. 'smollm2')."""
    return [engine.model_name] + [a for a in aliases if a]


def create_app(engine: Any, *, model_names: Sequence[str] | None = None) -> Starlette:
    """An OpenAI-compatible app over `engine`; `model_names[0]` is the id /v1/models lists first."""
    state = ServerState(engine, model_names or default_model_names(engine))
    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={P.ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.server = state
    return app
