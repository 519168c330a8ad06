"""Structured output and tools of one request: what it asks (`parse`), the grammar its output is held to
(`Structured.compile`, a skippy.constrain.Grammar), and its answers rewritten with the tool calls parsed
out of them (`Structured.choice_message`).

Request fields (OpenAI's and llama-server's):
- `response_format`: {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}} (the output is held to the schema either way: strict or not);
- `grammar` (llama-server: GBNF, or Lark) and `json_schema` (llama-server: a bare schema);
- chat only: `tools`, `tool_choice` (auto | none | required | a named function: the last two are forced by a
  grammar, so even a small model emits a parseable call), `parallel_tool_calls`, `chat_template_kwargs`.
A schema or grammar that cannot compile is a 400 naming why (GrammarError).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import attrs

from ..constrain import GrammarError, GrammarSpec
from . import tools as T
from .api_errors import bad_request, generation_failed, shutting_down
from .wire import sse_event, usage_json

FIELDS = {"response_format", "grammar", "json_schema"}
CHAT_FIELDS = {"tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"}


@attrs.frozen
class Structured:
    spec: GrammarSpec | None = None  # the output's grammar (response_format / grammar / json_schema)
    tools: T.ToolSpec | None = None
    template_kwargs: dict | None = None
    param: str | None = None  # the request field the grammar came from (for a 400)

    @property
    def constrained(self) -> bool:
        return self.spec is not None or (self.tools is not None and self.tools.forced)

    @property
    def tools_active(self) -> bool:
        return self.tools is not None and self.tools.active

    def template_tools(self) -> list[dict] | None:
        """The tools the prompt shows the model (none with tool_choice none, as OpenAI)."""
        return list(self.tools.tools) if self.tools_active else None

    async def compile(self, engine: Any) -> Any:
        """The request's Grammar for `engine` (None: unconstrained), compiled in a thread; a 400 if it
        cannot be. The first grammar of an engine also builds its vocabulary bridge (~0.2 s)."""
        if not self.constrained:
            return None
        import trio

        from ..constrain import compile_grammar

        try:
            if self.tools is not None and self.tools.forced:
                fmt = T.template_format(_template_source(engine))
                lark = T.forcing_grammar(self.tools, fmt)
                return await trio.to_thread.run_sync(
                    lambda: compile_grammar(engine.runtime, GrammarSpec("lark", lark), lark=lark))
            return await trio.to_thread.run_sync(compile_grammar, engine.runtime, self.spec)
        except GrammarError as exc:
            raise bad_request(str(exc), param=self.param or "tools", code="invalid_grammar") from None

    def choice_message(self, engine: Any, text: str) -> tuple[dict[str, Any], str | None]:
        """(message fields, finish reason override) of one answer: content and tool_calls when it holds calls."""
        if not self.tools_active:
            return {"content": text}, None
        content, calls = T.parse_calls(text, T.template_format(_template_source(engine)), self.tools.names)
        if not calls:
            return {"content": text}, None
        return {"content": content, "tool_calls": calls}, "tool_calls"


def _template_source(engine: Any) -> str | None:
    model = getattr(engine.runtime, "model", None)
    return model.chat_template if model is not None else None


def _response_format(value: Any) -> GrammarSpec | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'", param="response_format",
                          code="invalid_type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind == "json_schema":
        js = value.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request("'response_format.json_schema' must be an object with a 'schema'",
                              param="response_format.json_schema", code="invalid_type")
        schema = js.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise bad_request("'response_format.json_schema.schema' must be a JSON schema object",
                              param="response_format.json_schema.schema", code="invalid_type")
        return GrammarSpec("json_schema", schema)
    raise bad_request(f"Invalid 'response_format.type': {kind!r} (text, json_object or json_schema)",
                      param="response_format.type")


def parse(data: Mapping[str, Any], kind: str) -> Structured:
    """The structured-output fields of a request body (everything unset: an unconstrained Structured)."""
    given = [n for n in ("response_format", "grammar", "json_schema") if data.get(n) not in (None, "", {})]
    spec, param = None, None
    if len(given) > 1:
        raise bad_request(f"Give only one of {', '.join(repr(n) for n in given)}", param=given[1],
                          code="conflicting_parameters")
    if given:
        param = given[0]
        value = data[param]
        if param == "response_format":
            spec = _response_format(value)
        elif param == "grammar":
            if not isinstance(value, str):
                raise bad_request("'grammar' must be a string (GBNF or Lark)", param="grammar", code="invalid_type")
            spec = GrammarSpec("grammar", value)
        else:
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as exc:
                    raise bad_request(f"'json_schema' is not valid JSON: {exc}", param="json_schema") from None
            if not isinstance(value, dict):
                raise bad_request("'json_schema' must be a JSON schema object", param="json_schema",
                                  code="invalid_type")
            spec = GrammarSpec("json_schema", value)
    tools = template_kwargs = None
    if kind == "chat":
        tools = T.parse_tools(data)
        kw = data.get("chat_template_kwargs")
        if kw is not None and not isinstance(kw, dict):
            raise bad_request("'chat_template_kwargs' must be an object", param="chat_template_kwargs",
                              code="invalid_type")
        template_kwargs = kw or None
        if tools is not None and tools.forced and spec is not None:
            raise bad_request(f"'{param}' cannot be combined with a forced 'tool_choice'", param=param,
                              code="conflicting_parameters")
        messages = data.get("messages")
        if isinstance(messages, list):
            T.check_messages([m for m in messages if isinstance(m, dict)])
    return Structured(spec, tools, template_kwargs, param)


# -- the app's hooks (server.app) -----------------------------------------------------------------


async def prepare(state: Any, call: Any) -> Any:
    """The call with its grammar compiled (unchanged when unconstrained); 400s for what cannot run."""
    s = call.structured
    if s is None or not s.constrained:
        return call
    if not getattr(state, "local_sampling", True):
        raise bad_request(f"'{s.param or 'tool_choice'}' is not supported when serving a staged pipeline",
                          param=s.param or "tool_choice", code="unsupported_parameter")
    return attrs.evolve(call, grammar=await s.compile(state.engine))


def template_args(call: Any) -> dict[str, Any]:
    """engine.chat_tokens' keyword arguments for the call's tools and chat_template_kwargs."""
    s = call.structured
    if s is None:
        return {}
    out: dict[str, Any] = {}
    if s.template_tools():
        out["tools"] = s.template_tools()
    if s.template_kwargs:
        out["template_kwargs"] = s.template_kwargs
    return out


def rewrite(engine: Any, call: Any, body: dict[str, Any]) -> None:
    """A non-streamed chat response with its tool calls parsed out of each choice's text (in place)."""
    s = call.structured if call is not None else None
    if s is None or not s.tools_active or body.get("object") != "chat.completion":
        return
    for choice in body["choices"]:
        fields, reason = s.choice_message(engine, choice["message"].get("content") or "")
        choice["message"].update(fields)
        if reason is not None and choice.get("finish_reason") == "stop":
            choice["finish_reason"] = reason


def streams_tools(call: Any) -> bool:
    """A streamed chat request whose answers may be tool calls: its text goes through a CallParser."""
    s = call.structured
    return call.kind == "chat" and s is not None and s.tools_active


def _delta_encoder(shape: Any, call: Any, index: int) -> Any:
    """delta -> one SSE event of choice `index`: the chunk around the delta rendered once per choice,
    so a streamed token costs the dump of its small delta only (as protocol's text encoder does)."""
    mark = "\x00skippy-delta\x00"
    chunk = shape.chunk("", None, include_usage=call.include_usage, index=index)
    chunk["choices"][0]["delta"] = mark
    head, sep, tail = json.dumps(chunk).partition(json.dumps(mark))
    assert sep, "the chunk must carry its delta verbatim"
    head_b, tail_b = b"data: " + head.encode(), tail.encode() + b"\r\n\r\n"
    return lambda delta: head_b + json.dumps(delta).encode() + tail_b


def _deltas(events: list[Any], encode: Any) -> list[bytes]:
    """A CallParser's events as OpenAI deltas: content, a call's first delta (index, id, type, name,
    empty arguments), then its argument fragments."""
    from .tool_stream import ArgsDelta, CallStart

    out = []
    for e in events:
        if isinstance(e, ArgsDelta):
            out.append(encode({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]}))
        elif isinstance(e, CallStart):
            out.append(encode({"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                               "function": {"name": e.name, "arguments": ""}}]}))
        elif e.text:
            out.append(encode({"content": e.text}))
    return out


async def tool_sse(state: Any, streams: list[Any], shape: Any, call: Any, t_arrival: float,
                   receive: Any = None) -> Any:
    """The SSE events of a streamed tool-capable chat: the role first, then each choice's content and tool
    call deltas as its tokens come (server.tool_stream holds back what may be a call), its finish chunk
    (tool_calls when it made any), usage, [DONE]. One stream is read directly; several come through
    `receive` (app._pump). Logprobs are not streamed on this route."""
    import time

    import trio

    from .tool_stream import CallParser

    s: Structured = call.structured
    k = len(streams)
    if receive is None:
        only = streams[0]

        async def receive() -> tuple[int, list[Any]]:
            return 0, await only.batch()

    parsers = [CallParser(s.tools.names) for _ in range(k)]
    encoders = [_delta_encoder(shape, call, i) for i in range(k)]
    finals: list[Any] = [None] * k
    timing = [[None, None, 0] for _ in range(k)]
    try:
        yield sse_event(shape.chunk("", first=True, include_usage=call.include_usage))
        done = 0
        while done < k:
            try:
                i, events = await receive()
            except trio.EndOfChannel:
                i, events = 0, []
            if not events:  # ended without a final event: cancelled by shutdown
                yield sse_event(shutting_down().body())
                break
            now = time.perf_counter()
            t = timing[i]
            for event in events:
                if event.token is not None:
                    t[2] += 1
                    t[1] = now
                    t[0] = t[0] or now
            final = events[-1] if events[-1].final else None
            if final is not None and final.finish_reason in ("cancelled", "error"):
                err = shutting_down() if final.finish_reason == "cancelled" else generation_failed(final.error)
                yield sse_event(err.body())
                break
            parser = parsers[i]
            parsed = parser.feed("".join(e.text for e in events))
            if final is not None:
                parsed += parser.finish()
            out = _deltas(parsed, encoders[i])
            if final is not None:
                finals[i] = final
                done += 1
                chunk = shape.chunk("", None, include_usage=call.include_usage, index=i)
                reason = final.finish_reason
                chunk["choices"][0]["finish_reason"] = "tool_calls" if parser.calls and reason == "stop" else reason
                out.append(sse_event(chunk))
                if done == k and call.include_usage:
                    n = getattr(call, "n", 1)
                    us = [f.usage for f in finals]
                    out.append(sse_event(shape.usage_chunk(usage_json(
                        sum(u.prompt_tokens for u in us[::n]), sum(u.completion_tokens for u in us),
                        sum(u.cached_tokens for u in us[::n])))))
            if out:
                yield b"".join(out)
                if events[0].t_sampled:
                    state.metrics.delivery.observe(time.perf_counter() - events[0].t_sampled)
        yield sse_event("[DONE]")
    finally:
        for stream in streams:
            stream.cancel()
            state.untrack(stream)
        for t_first, t_last, n_tok in timing:
            state.metrics.observe(t_arrival, t_first, t_last, n_tok)
