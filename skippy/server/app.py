"""The ASGI app (Starlette, run on trio through anyio) bound to one engine.

`create_app(engine)` returns an app whose `state.server` (a ServerState) tracks in-flight
requests and the draining flag that graceful shutdown sets; everything protocol-shaped is
in `protocol` (request fields in `fields`), /tokenize and /detokenize shapes in `tokens`,
`--api-key` in `auth`, everything Prometheus-shaped in `metrics`.
"""

from __future__ import annotations

import itertools
import time
import uuid
from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import trio
from loguru import logger
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import SkippyError
from . import fields as F
from . import protocol as P
from . import structured as S
from . import tokens as T
from . import worker_api
from ._inline_writes import InlineWriter, counted
from .auth import BearerAuth
from .event_stream import EventStream
from .logprob_shapes import ChoiceView, Pieces
from .metrics import CONTENT_TYPE, ServerMetrics


class ServerState:
    """What the handlers share: the engine, served names, metrics, in-flight streams, draining."""

    def __init__(self, engine: Any, model_names: Sequence[str], inline_writes: bool = True) -> None:
        self.engine = engine
        self.inline_writes = inline_writes  # streamed tokens written from the step (_inline_writes)
        self.model_names = list(dict.fromkeys(model_names))
        self.local_sampling = _samples_locally(engine)
        self.created = int(time.time())
        self.metrics = ServerMetrics(engine)
        self.pieces = Pieces(engine.runtime.piece)  # token text for logprobs (the vocabulary never changes)
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


def _samples_locally(engine: Any) -> bool:
    """Whether the engine's sampler sees the logits (penalties and logit_bias need it): not so for a
    staged pipeline, whose last stage samples in another process."""
    try:
        from ..staged._pipeline import PipelineRuntime
    except Exception:  # pragma: no cover - no staged package: no pipeline either
        return True
    return not isinstance(getattr(engine, "runtime", None), PipelineRuntime)


def _error_response(err: P.ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _prompts(state: ServerState, call: P.GenerateCall) -> list[Any]:
    """What each choice generates from: chat messages through the GGUF's own template; completion
    prompts as given (text or ids), text tokenized here only when its length sets the limit."""
    engine = state.engine
    if call.kind != "chat":
        if call.max_tokens is not None:
            return list(call.prompts)
        return [engine.runtime.tokenize(p) if isinstance(p, str) else p for p in call.prompts]
    if not engine.has_chat_template:
        raise P.ApiError(400, "this engine has no model with a chat template", code="no_chat_template")
    try:
        return [engine.chat_tokens(call.prompt, **S.template_args(call))]
    except SkippyError as exc:
        raise P.bad_request(str(exc), param="messages") from None


def _check_sampling(state: ServerState, call: P.GenerateCall) -> None:
    """Penalties and logit_bias need the sampler beside the logits, with the request's tokens; a
    pipeline's last stage samples from (temperature, top_k, top_p, min_p, draw) alone."""
    param = call.shaping_param
    if param is None and (call.logprobs is not None or call.prompt_logprobs is not None):
        param = "logprobs" if call.logprobs is not None else "echo"  # computed where the logits are
    if param is not None and not state.local_sampling:
        raise P.bad_request(f"'{param}' is not supported when serving a staged pipeline", param=param,
                            code="unsupported_parameter")
    P.check_token_ids(call, state.engine.runtime.n_vocab)


async def _submit(state: ServerState, call: P.GenerateCall, prompts: Sequence[Any]) -> list[Any]:
    """One engine request per prompt, each queued (or the error of the first that is not: the rest cancelled)."""
    engine = state.engine
    streams: list[Any] = []
    try:
        for prompt in prompts:
            max_tokens = call.max_tokens
            if max_tokens is None:  # no limit: the rest of the context
                max_tokens = P.resolve_max_tokens(call, len(prompt), engine.n_ctx)
            if call.n == 1:
                choices = [engine.generate(prompt, **call.engine_kwargs(max_tokens))]
            else:  # forks of one prompt: computed once, its cells shared (scheduling.forks)
                choices = engine.generate_choices(prompt, n=call.n, **call.engine_kwargs(max_tokens))
            for stream in choices:
                state.track(stream)
                streams.append(stream)
        for stream in streams:
            await stream.queued()
    except BaseException as exc:
        for stream in streams:
            stream.cancel()
            state.untrack(stream)
        if isinstance(exc, (SkippyError, ValueError)):
            raise P.engine_error(exc) from None
        raise
    return streams


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
    _check_sampling(state, call)
    call = await S.prepare(state, call)  # its grammar compiled (structured output, forced tool calls)
    t_arrival = time.perf_counter()
    streams = await _submit(state, call, _prompts(state, call))
    shape = P.ResponseShape(kind, state.request_id(kind), call.model)
    headers = F.ignored_header(call.ignored)
    views = _views(state, call, streams) if call.logprobs is not None or call.echo else None
    if not call.stream:
        return await _collect(request, state, streams, shape, t_arrival, headers, call, views)
    headers["Cache-Control"] = "no-cache"
    if state.engine.config.shed_late and not await _first_events(request, state, streams):
        return Response(status_code=499)  # the client left while its request waited: nothing to answer
    if S.streams_tools(call) and len(streams) == 1:  # tool calls parsed as the text comes (S.tool_sse)
        return EventStream(S.tool_sse(state, streams, shape, call, t_arrival), headers=headers)
    if S.streams_tools(call):
        tx, rx = trio.open_memory_channel(0)
        return EventStream(S.tool_sse(state, streams, shape, call, t_arrival, rx.receive), headers=headers,
                           feeder=partial(_pump, streams, tx))
    if len(streams) == 1:
        return EventStream(_sse(state, streams[0], shape, call, t_arrival, views=views, scope=request.scope),
                           headers=headers)
    tx, rx = trio.open_memory_channel(0)
    return EventStream(_sse(state, streams, shape, call, t_arrival, rx.receive, views), headers=headers,
                       feeder=partial(_pump, streams, tx))


async def _first_events(request: HttpRequest, state: ServerState, streams: Sequence[Any]) -> bool:
    """With `shed_late`, a streamed request may still be refused once queued (late: it could not make its
    first token in time). Wait for each choice's first event before the response starts, so that refusal
    is a 429 + Retry-After like any other, not an error event after a 200. False: the client hung up
    (the requests are cancelled)."""
    left = False

    async def watch_disconnect(scope: trio.CancelScope) -> None:
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        scope.cancel()

    refused = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            for stream in streams:
                first = await stream.first_event()
                if first is not None and first.final and first.finish_reason == "error":
                    refused = first
                    break
            nursery.cancel_scope.cancel()
    finally:
        if left or refused is not None:
            for stream in streams:
                stream.cancel()
                state.untrack(stream)
    if refused is not None:
        raise P.generation_failed(refused.error)
    return not left


def _views(state: ServerState, call: P.GenerateCall, streams: Sequence[Any]) -> list[ChoiceView]:
    """How each choice renders logprobs and echo: choice i is prompt i // n's."""
    views = []
    for i, stream in enumerate(streams):
        text = ""
        tokens = stream.request.prompt.tolist()
        if call.echo:
            given = call.prompts[i // call.n]
            text = given if isinstance(given, str) else b"".join(state.pieces.get(t)[0] for t in tokens).decode(
                "utf-8", errors="replace")
        views.append(ChoiceView(call.kind, state.pieces, call.logprobs is not None, call.echo, text, tokens))
    return views


async def _collect(request: HttpRequest, state: ServerState, streams: Sequence[Any], shape: P.ResponseShape,
                   t_arrival: float, headers: dict[str, str] | None = None, call: P.GenerateCall | None = None,
                   views: Sequence[ChoiceView] | None = None) -> Response:
    """Non-streaming: gather every choice's events; a client that hangs up cancels the requests."""
    k = len(streams)
    parts: list[list[Any]] = [[] for _ in range(k)]  # each choice's texts (its events, for `views`)
    finals: list[Any] = [None] * k
    timing = [[None, None, 0] for _ in range(k)]  # t_first, t_last, tokens

    async def watch_disconnect(scope: trio.CancelScope) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async def gather(i: int) -> None:
        t = timing[i]
        async for event in streams[i]:
            if event.token is not None:
                t[2] += 1
                t[1] = time.perf_counter()
                t[0] = t[0] or t[1]
            parts[i].append(event if views is not None else event.text)
            if event.final:
                finals[i] = event

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            async with trio.open_nursery() as choices:
                for i in range(k):
                    choices.start_soon(gather, i)
            nursery.cancel_scope.cancel()
    finally:
        for stream in streams:
            stream.cancel()
            state.untrack(stream)
    for t_first, t_last, n in timing:
        state.metrics.observe(t_arrival, t_first, t_last, n)
    if any(f is None or f.finish_reason == "cancelled" for f in finals):
        raise P.shutting_down()  # only shutdown ends a request whose client is still there
    failed = next((f for f in finals if f.finish_reason == "error"), None)
    if failed is not None:
        raise P.generation_failed(failed.error)
    n = call.n if call is not None else 1
    if views is not None:
        choices = [(*v.full(p), ) for v, p in zip(views, parts)]
        body = shape.full([(text, f.finish_reason, lp) for (text, lp), f in zip(choices, finals)], _usage(finals, n))
    else:
        body = shape.full([("".join(p), f.finish_reason) for p, f in zip(parts, finals)], _usage(finals, n))
    S.rewrite(state.engine, call, body)  # tool calls parsed out of chat answers
    return JSONResponse(body, headers=headers)


def _usage(finals: Sequence[Any], n: int = 1) -> dict[str, Any]:
    """Usage over every choice (OpenAI sums a multi-prompt request's tokens); a prompt with n choices
    counts its prompt tokens once (its first choice's: the forks shared them)."""
    us = [f.usage for f in finals]
    firsts = us[::n]
    return P.usage_json(sum(u.prompt_tokens for u in firsts), sum(u.completion_tokens for u in us),
                        sum(u.cached_tokens for u in firsts))


async def _pump(streams: Sequence[Any], tx: trio.MemorySendChannel) -> None:
    """Several prompts streamed: every stream's batches into one channel as they come (choices
    interleave, each in order). Runs in the SSE response's task group, which cancels it when done."""

    async def one(i: int, stream: Any, out: trio.MemorySendChannel) -> None:
        async with out:
            while True:
                events = await stream.batch()
                await out.send((i, events))
                if not events or events[-1].final:
                    return

    async with tx, trio.open_nursery() as nursery:
        for i, stream in enumerate(streams):
            nursery.start_soon(one, i, stream, tx.clone())


async def _sse(state: ServerState, streams: Any, shape: P.ResponseShape, call: P.GenerateCall,
               t_arrival: float, receive: Callable[[], Awaitable[tuple[int, list[Any]]]] | None = None,
               views: Sequence[ChoiceView] | None = None, scope: dict[str, Any] | None = None
               ) -> AsyncIterator[bytes]:
    """Streaming: chunks per token (each with its choice's index), usage last when asked, then [DONE].
    One stream is read directly; several come through `receive` (see `_pump`). The tokens that queued
    while the client was slow go out in one write, each once and in order. Being cancelled (the client
    left: EventStream cancels us) cancels the requests. With the response's `scope`, one stream's
    tokens are written from the step once the response has started, where `_inline_writes` applies."""
    streams = list(streams) if isinstance(streams, (list, tuple)) else [streams]
    k = len(streams)
    writer: InlineWriter | None = None
    if receive is None:
        only = streams[0]

        async def receive() -> tuple[int, list[Any]]:
            return 0, await only.batch()

    timing = [[None, None, 0] for _ in range(k)]  # t_first, t_last, tokens
    first = [True] * k
    finals: list[Any] = [None] * k
    encoders = [shape.text_event_encoder(call.include_usage, i) for i in range(k)]

    def render(i: int, event: Any, now: float, out: list[bytes]) -> None:
        t = timing[i]
        if event.token is not None:
            t[2] += 1
            t[1] = now
            t[0] = t[0] or now
        if event.final:
            return
        if views is not None:  # logprobs or echo: each chunk rendered whole
            out += _view_chunks(views[i], event, shape, call, first, i)
        elif event.text:
            out.append(encoders[i](event.text, first[i]))
            first[i] = False

    def render_one(event: Any) -> bytes:
        out: list[bytes] = []
        render(0, event, time.perf_counter(), out)
        return b"".join(out)

    def go_inline() -> InlineWriter | None:  # after a write: the response has started
        if scope is None or k != 1 or not state.inline_writes:
            return None
        inline = InlineWriter.for_this_response(scope, render_one, counted(state.metrics), state.engine)
        if inline is not None:
            streams[0].divert(inline.take)
        return inline

    try:
        if call.kind == "chat":  # OpenAI opens a chat stream with the role
            yield P.sse_event(shape.chunk("", first=True, include_usage=call.include_usage))
            first[0] = False
            writer = go_inline()
        done = 0
        while done < k:
            try:
                i, events = await receive()
            except trio.EndOfChannel:
                i, events = 0, []
            if writer is not None:
                await writer.flush()  # what the socket did not take of an inline write goes first
            if not events:  # ended without a final event: cancelled by shutdown
                yield P.sse_event(P.shutting_down().body())
                break
            now = time.perf_counter()
            out: list[bytes] = []
            final = None
            for event in events:
                render(i, event, now, out)
                if event.final:
                    final = event
                    break
            failed = False
            if final is not None:
                finals[i] = final
                done += 1
                failed = final.finish_reason in ("cancelled", "error")
                if views is not None and not failed:
                    out += _view_chunks(views[i], final, shape, call, first, i)
                out += _final_events(final, shape, call, encoders[i], first[i], i, text=views is None)
                if done == k and not failed and call.include_usage:
                    out.append(P.sse_event(shape.usage_chunk(_usage(finals, call.n))))
            if out:
                yield b"".join(out)
                state.metrics.writes_task += 1
                if events[0].t_sampled:  # the oldest token of this write: sampled -> its bytes written
                    state.metrics.delivery.observe(time.perf_counter() - events[0].t_sampled)
                if writer is None and final is None:
                    writer = go_inline()
            if failed:
                break
        yield P.sse_event("[DONE]")
    finally:
        if writer is not None:
            writer.close()
        for stream in streams:
            stream.cancel()
            state.untrack(stream)
        for t_first, t_last, n in timing:
            state.metrics.observe(t_arrival, t_first, t_last, n)


def _view_chunks(view: ChoiceView, event: Any, shape: P.ResponseShape, call: P.GenerateCall, first: list[bool],
                 i: int) -> list[bytes]:
    out = []
    for text, logprobs in view.chunks(event):
        out.append(P.sse_event(shape.chunk(text, first=first[i], include_usage=call.include_usage, index=i,
                                           logprobs=logprobs)))
        first[i] = False
    return out


def _final_events(final: Any, shape: P.ResponseShape, call: P.GenerateCall, encode: Any, first: bool,
                  index: int = 0, text: bool = True) -> list[bytes]:
    if final.finish_reason in ("cancelled", "error"):
        err = P.shutting_down() if final.finish_reason == "cancelled" else P.generation_failed(final.error)
        return [P.sse_event(err.body())]
    out = [encode(final.text, first)] if final.text and text else []
    out.append(P.sse_event(shape.chunk("", final.finish_reason, include_usage=call.include_usage, index=index)))
    return out


# -- routes ---------------------------------------------------------------------------------


async def completions(request: HttpRequest) -> Response:
    return await _generate(request, "completion")


async def chat_completions(request: HttpRequest) -> Response:
    return await _generate(request, "chat")


async def models(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse(P.models_json(state.model_names, state.created, state.engine.n_ctx, _model_meta(state.engine)))


def _model_meta(engine: Any) -> dict[str, Any]:
    """llama-server's `meta` of a model: what we know of it without reading the file again."""
    runtime = engine.runtime
    meta: dict[str, Any] = {"n_ctx": engine.n_ctx, "n_vocab": runtime.n_vocab}
    model = getattr(runtime, "model", None)
    if model is not None:
        meta["n_ctx_train"] = model.n_ctx_train
    return meta


async def _json_body(request: HttpRequest) -> dict[str, Any] | None:
    try:
        return P.parse_json(await request.body())
    except ClientDisconnect:
        return None


async def tokenize(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    data = await _json_body(request)
    if data is None:
        return Response(status_code=499)
    content, add_special, pieces, ignored = T.parse_tokenize(data)
    runtime = state.engine.runtime
    ids = [int(t) for t in runtime.tokenize(content, add_special)]
    tokens: list[Any] = T.with_pieces(ids, runtime.piece) if pieces else ids
    return JSONResponse({"tokens": tokens}, headers=F.ignored_header(ignored))


async def detokenize(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    data = await _json_body(request)
    if data is None:
        return Response(status_code=499)
    runtime = state.engine.runtime
    tokens, ignored = T.parse_detokenize(data, runtime.n_vocab)
    return JSONResponse({"content": T.detokenize(tokens, runtime.piece)}, headers=F.ignored_header(ignored))


async def tokenizer_info(request: HttpRequest) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse(T.tokenizer_info(state.engine))


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


def create_app(engine: Any, *, model_names: Sequence[str] | None = None,
               api_keys: Sequence[str] | str | None = None, inline_writes: bool = True) -> Starlette:
    """An OpenAI-compatible app over `engine`; `model_names[0]` is the id /v1/models lists first, and
    every name answers in `model`. With `api_keys`, every route but /health and /metrics needs
    `Authorization: Bearer <one of them>`. `inline_writes=False` sends every streamed chunk through the
    response's task (see `_inline_writes`; served by hypercorn through `serve_app`, it is on by default)."""
    state = ServerState(engine, model_names or default_model_names(engine), inline_writes)
    keys = [api_keys] if isinstance(api_keys, str) else list(api_keys or ())
    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            *worker_api.routes(),  # what a router asks of its workers (sglang-router's contract)
        ],
        middleware=[Middleware(BearerAuth, keys=keys)] if keys else [],
        exception_handlers={P.ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.server = state
    return app
