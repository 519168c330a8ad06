"""The OpenAI wire protocol, pure: request validation -> engine call arguments, and the
response, chunk and error JSON shapes. No trio, no ASGI, no engine: unit-testable alone.

What we reject mirrors OpenAI's API: an unknown field is a 400 ("Unrecognized request
argument"), a field we know but do not implement is accepted only at its neutral value
(n=1, echo=false, logprobs off, zero penalties, ...) and is a 400 naming it otherwise.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Callable, Mapping, Sequence

import attrs

from ..errors import (
    EngineClosedError,
    InvalidInputError,
    OverloadedError,
    PromptTooLongError,
    SkippyError,
)

# -- errors ------------------------------------------------------------------------------


class ApiError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


RETRY_AFTER_S = 1


def engine_error(exc: BaseException) -> ApiError:
    """The HTTP status of an engine exception raised at submission."""
    if isinstance(exc, OverloadedError):
        return ApiError(429, str(exc), type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, PromptTooLongError):
        return ApiError(400, str(exc), param="prompt", code="context_length_exceeded")
    if isinstance(exc, (InvalidInputError, ValueError)):  # generate() validates its arguments
        return ApiError(400, str(exc))
    if isinstance(exc, EngineClosedError):
        return shutting_down()
    if isinstance(exc, SkippyError):
        return ApiError(500, str(exc), type="server_error")
    return ApiError(500, "internal error", type="server_error")


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", type="server_error", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist", param="model", code="model_not_found")


# -- requests ----------------------------------------------------------------------------


@attrs.frozen
class GenerateCall:
    """What a validated request asks of the engine; `prompt` is text, token ids, or chat messages."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: Any
    max_tokens: int | None  # None: the rest of the context
    sampling: dict[str, Any]
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool
    priority: int

    def engine_kwargs(self, max_tokens: int) -> dict[str, Any]:
        return dict(sampling=self.sampling, max_tokens=max_tokens, stop=self.stop, priority=self.priority,
                    ignore_eos=self.ignore_eos)


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object", code="invalid_json")
    return data


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _want(data: Mapping[str, Any], name: str, ok: Callable[[Any], bool], what: str, default: Any = None) -> Any:
    v = data.get(name)
    if v is None:
        return default
    if not ok(v):
        raise bad_request(f"Invalid type or value for '{name}': expected {what}, got {v!r}", param=name,
                          code="invalid_type")
    return v


# accepted only at their neutral value (OpenAI's default); anything else is unsupported here
_NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v == 1 and _is_int(v),
    "best_of": lambda v: v == 1 and _is_int(v),
    "echo": lambda v: v is False,
    "logprobs": lambda v: v is False or v == 0 and _is_int(v),
    "top_logprobs": lambda v: v == 0 and _is_int(v),
    "presence_penalty": lambda v: _is_num(v) and v == 0,
    "frequency_penalty": lambda v: _is_num(v) and v == 0,
    "logit_bias": lambda v: v == {},
    "suffix": lambda v: v == "",
    "parallel_tool_calls": lambda v: isinstance(v, bool),
    "tool_choice": lambda v: v == "none",
    "tools": lambda v: v == [],
    "functions": lambda v: v == [],
    "response_format": lambda v: isinstance(v, dict) and v.get("type") == "text",
    "store": lambda v: v is False,
    "modalities": lambda v: v == ["text"],
}
_IGNORED = {"user", "metadata", "service_tier", "reasoning_effort"}  # accepted, no effect
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
           "stream_options", "ignore_eos", "priority"}
_COMPLETION = _COMMON | {"prompt"}
_CHAT = _COMMON | {"messages", "max_completion_tokens"}


def _check_fields(data: Mapping[str, Any], allowed: set[str]) -> None:
    for name, value in data.items():
        if name in allowed or name in _IGNORED:
            continue
        neutral = _NEUTRAL.get(name)
        if neutral is None:
            raise bad_request(f"Unrecognized request argument supplied: {name}", param=name,
                              code="unrecognized_argument")
        if value is not None and not neutral(value):
            raise bad_request(f"'{name}' is not supported by this server (only its default value is accepted); "
                              f"got {value!r}", param=name, code="unsupported_parameter")


def _common(data: Mapping[str, Any], kind: str, prompt: Any, max_tokens_field: str = "max_tokens") -> GenerateCall:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", param="model",
                          code="missing_required_parameter" if model is None else "invalid_type")
    max_tokens = _want(data, max_tokens_field, lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    sampling = {
        "temperature": float(_want(data, "temperature", lambda v: _is_num(v) and 0 <= v <= 2, "a number in [0, 2]", 1.0)),
        "top_p": float(_want(data, "top_p", lambda v: _is_num(v) and 0 < v <= 1, "a number in (0, 1]", 1.0)),
        "top_k": _want(data, "top_k", lambda v: _is_int(v) and v >= 0, "an integer >= 0", 0),
        "min_p": float(_want(data, "min_p", lambda v: _is_num(v) and 0 <= v <= 1, "a number in [0, 1]", 0.0)),
        "seed": _want(data, "seed", lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    }
    stop = data.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = tuple(s for s in stop if s)
    else:
        raise bad_request(f"Invalid type or value for 'stop': expected a string or up to 4 strings, got {stop!r}",
                          param="stop", code="invalid_type")
    stream = _want(data, "stream", lambda v: isinstance(v, bool), "a boolean", False)
    opts = _want(data, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    if set(opts) - {"include_usage"} or not isinstance(opts.get("include_usage", False), bool):
        raise bad_request(f"Invalid 'stream_options': {opts!r}", param="stream_options", code="invalid_type")
    if opts and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    return GenerateCall(
        kind=kind, model=model, prompt=prompt, max_tokens=max_tokens, sampling=sampling, stop=stops,
        stream=stream, include_usage=bool(opts.get("include_usage", False)),
        ignore_eos=_want(data, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False),
        priority=_want(data, "priority", _is_int, "an integer", 0),
    )


def parse_completion(data: Mapping[str, Any]) -> GenerateCall:
    """POST /v1/completions: one prompt (text or token ids); OpenAI's default max_tokens is 16."""
    _check_fields(data, _COMPLETION)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", param="prompt")
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        pass
    elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request("Only one prompt per request is supported (a batch of prompts is not)", param="prompt",
                          code="unsupported_parameter")
    else:
        raise bad_request(f"'prompt' must be a non-empty string or a list of token ids, got {prompt!r}",
                          param="prompt", code="invalid_type" if prompt is not None else "missing_required_parameter")
    call = _common(data, "completion", prompt)
    return call if call.max_tokens is not None else attrs.evolve(call, max_tokens=16)


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"messages[{i}].content: only text parts are supported", param=f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content",
                      code="invalid_type")


def parse_chat(data: Mapping[str, Any]) -> GenerateCall:
    """POST /v1/chat/completions: messages rendered later with the model's own template."""
    _check_fields(data, _CHAT)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", param="messages",
                          code="missing_required_parameter" if messages is None else "invalid_type")
    rendered = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]", code="invalid_type")
        if m["role"] not in _ROLES:
            raise bad_request(f"messages[{i}].role: unknown role {m['role']!r}", param=f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        rendered.append({"role": role, "content": _content_text(m.get("content"), i)})
    call = _common(data, "chat", rendered)
    if data.get("max_tokens") is not None and data.get("max_completion_tokens") is not None:
        raise bad_request("Give one of 'max_tokens' and 'max_completion_tokens'", param="max_completion_tokens")
    mct = _want(data, "max_completion_tokens", lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    return call if mct is None else attrs.evolve(call, max_tokens=mct)


def resolve_max_tokens(call: GenerateCall, n_prompt: int, n_ctx: int) -> int:
    """Chat without a limit gets the rest of the context (at least 1, so the engine names the error)."""
    return call.max_tokens if call.max_tokens is not None else max(1, n_ctx - n_prompt)


# -- responses ---------------------------------------------------------------------------


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def finish_reason(reason: str | None) -> str | None:
    """OpenAI knows stop and length; a cancelled or failed request never gets here as a success."""
    return reason if reason in ("stop", "length") else None


class ResponseShape:
    """Builds the response and stream chunks of one request (completion or chat)."""

    def __init__(self, kind: str, rid: str, model: str, created: int | None = None) -> None:
        self.kind = kind
        self.id = rid
        self.model = model
        self.created = int(time.time()) if created is None else created

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "skippy"}

    def full(self, text: str, reason: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": finish_reason(reason)}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str, reason: str | None = None, *, first: bool = False,
              include_usage: bool = False) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason(reason)}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}
            out = {**self._head("text_completion"), "choices": [choice]}
        if include_usage:
            out["usage"] = None  # OpenAI: null on every chunk but the usage-only last one
        return out

    def text_event_encoder(self, include_usage: bool) -> Callable[[str, bool], bytes]:
        """(text, first) -> one SSE event carrying a content chunk, as bytes. The JSON around the text
        is rendered once per request, so a streamed token costs one string escape, not a dict and a dump."""
        mark = "\x00skippy-text\x00"

        def halves(first: bool) -> tuple[bytes, bytes]:
            head, sep, tail = json.dumps(self.chunk(mark, first=first, include_usage=include_usage)).partition(
                json.dumps(mark))
            assert sep, "the chunk must carry its text verbatim"
            return b"data: " + head.encode(), tail.encode() + b"\r\n\r\n"

        plain, opening = halves(False), halves(True)

        def encode(text: str, first: bool = False) -> bytes:
            head, tail = opening if first else plain
            return head + json.dumps(text).encode() + tail

        return encode

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}


def sse_event(obj: Any) -> bytes:
    """One server-sent event whose data is `obj` as JSON (or a literal string such as [DONE])."""
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return b"data: " + data.encode() + b"\r\n\r\n"


def models_json(names: Sequence[str], created: int) -> dict[str, Any]:
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "skippy"} for n in names]}
