"""The OpenAI wire protocol, pure: request validation -> engine call arguments, and the
response, chunk and error JSON shapes. No trio, no ASGI, no engine: unit-testable alone.

Reading requests follows vLLM (see `fields`): fields we know are validated strictly, unknown
ones are accepted and ignored (and reported back); a field we know but do not implement
(best_of, tools, ...) is accepted only at its neutral value and is a 400 naming it otherwise.
Logprobs shapes are in `logprob_shapes`.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Mapping, Sequence

import attrs

from . import fields as F
from . import structured as S
from .api_errors import (  # noqa: F401  (re-exported: the app and tests use them as protocol.*)
    RETRY_AFTER_S,
    ApiError,
    bad_request,
    engine_error,
    error_body,
    not_found,
    shutting_down,
    generation_failed,
    unauthorized,
)
from .wire import sse_event, usage_json  # noqa: F401  (re-exported: the app and tests use them as protocol.*)

# -- requests ----------------------------------------------------------------------------


@attrs.frozen
class GenerateCall:
    """What a validated request asks of the engine: one generation per prompt (text, token ids, or
    chat messages), each its own choice `index` in order."""

    kind: str  # "completion" | "chat"
    model: str
    prompts: tuple[Any, ...]
    max_tokens: int | None  # None: the rest of the context
    sampling: dict[str, Any]
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool
    priority: int
    ignored: tuple[str, ...] = ()  # unknown request fields, accepted with no effect
    n: int = 1  # choices per prompt (forks of one prompt: its cells shared)
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    echo: bool = False  # completions: the prompt returned before the completion (scored, with logprobs)
    structured: S.Structured | None = None  # response_format / grammar / tools (server.structured)
    grammar: Any = None  # its compiled skippy.constrain.Grammar, set by the app before submitting
    # vLLM's: sampled ids that finish a choice, tokens before which nothing but the length finishes
    # it, and whether a stop string found stays in the text
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    include_stop_str_in_output: bool = False

    @property
    def prompt(self) -> Any:
        """The first (usually the only) prompt."""
        return self.prompts[0]

    @property
    def shaping_param(self) -> str | None:
        """The name of a sampling field that needs the sampler beside the logits (penalties, bias), if any."""
        found = next((k for k in ("presence_penalty", "frequency_penalty", "repeat_penalty", "logit_bias", "typical_p",
                                "xtc_probability", "mirostat", "dry_multiplier")
                      if k in self.sampling), None)
        return found or ("min_tokens" if self.min_tokens else None)  # it masks the end ids out of the logits

    @property
    def prompt_logprobs(self) -> int | None:
        """What the engine scores of the prompt: with echo and logprobs, every prompt token; with echo and
        max_tokens 0 too (nothing to generate: the request is the prompt's pass)."""
        if not self.echo:
            return None
        if self.logprobs is not None:
            return self.logprobs
        return 0 if self.max_tokens == 0 else None

    def engine_kwargs(self, max_tokens: int) -> dict[str, Any]:
        kw = dict(sampling=self.sampling, max_tokens=max_tokens, stop=self.stop, priority=self.priority,
                  ignore_eos=self.ignore_eos)
        if self.logprobs is not None:
            kw["logprobs"] = self.logprobs
        if self.prompt_logprobs is not None:
            kw["prompt_logprobs"] = self.prompt_logprobs
        if self.grammar is not None:
            kw["grammar"] = self.grammar
        if self.stop_token_ids:
            kw["stop_token_ids"] = self.stop_token_ids
        if self.min_tokens:
            kw["min_tokens"] = min(self.min_tokens, max_tokens)  # max_tokens None: the context's rest, maybe less
        if self.include_stop_str_in_output:
            kw["include_stop_str_in_output"] = True
        return kw


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")  # JSON on the wire is UTF-8 (RFC 8259); strict: no encoded surrogates
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    except RecursionError:  # nesting deeper than the parser's stack
        raise bad_request("We could not parse the JSON body of your request: nested too deeply",
                          code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object", code="invalid_json")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(data):
        raise bad_request("The JSON body of your request holds a lone UTF-16 surrogate escape (e.g. \\ud800): "
                          "not Unicode text", code="invalid_json")
    return data


# JSON may escape a lone surrogate, which no text encoding can carry on (UTF-8, a tokenizer, a reply)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(data: Any) -> bool:
    """Any string (key or value) in parsed JSON that is not valid Unicode; iterative (any depth)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _common(data: Mapping[str, Any], kind: str, prompts: tuple[Any, ...], ignored: tuple[str, ...]) -> GenerateCall:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", param="model",
                          code="missing_required_parameter" if model is None else "invalid_type")
    limit, given = F.max_tokens(data, kind)
    if kind == "completion" and not given:
        limit = 16  # OpenAI's default for completions
    stream = F.want(data, "stream", lambda v: isinstance(v, bool), "a boolean", False)
    include_usage, more_ignored = F.stream_options(data, stream)
    echo = F.echo(data) if kind == "completion" else False
    n = F.n_choices(data)
    if limit == 0 and not echo:
        raise bad_request("'max_tokens' 0 needs 'echo': true (the prompt scored, nothing generated)",
                          param="max_tokens")
    if limit == 0 and n > 1:
        raise bad_request("'n' > 1 needs 'max_tokens' >= 1 (choices of nothing are one choice)", param="n")
    if n * len(prompts) > F.MAX_CHOICES:
        raise bad_request(f"at most {F.MAX_CHOICES} choices per request (prompts x n), got {n * len(prompts)}",
                          param="n")
    return GenerateCall(
        kind=kind, model=model, prompts=prompts, max_tokens=limit, sampling=F.sampling(data), stop=F.stops(data),
        stream=stream, include_usage=include_usage,
        ignore_eos=F.want(data, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False),
        priority=F.want(data, "priority", F.is_int, "an integer", 0),
        ignored=ignored + more_ignored, n=n, logprobs=F.logprobs(data, kind), echo=echo,
        structured=S.parse(data, kind), stop_token_ids=F.stop_token_ids(data), min_tokens=F.min_tokens(data, limit),
        include_stop_str_in_output=F.want(data, "include_stop_str_in_output", lambda v: isinstance(v, bool),
                                          "a boolean", False),
    )


def parse_completion(data: Mapping[str, Any]) -> GenerateCall:
    """POST /v1/completions: one prompt or a list of them (text or token ids); max_tokens defaults to 16."""
    ignored = F.check_fields(data, F.COMPLETION)
    return _common(data, "completion", F.completion_prompts(data.get("prompt")), ignored)


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
    ignored = F.check_fields(data, F.CHAT)
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
        calls = m.get("tool_calls")  # an assistant's tool calls (content may be null), a tool's result
        content = "" if m.get("content") is None and (calls or role == "assistant") else \
            _content_text(m.get("content"), i)
        rendered.append({"role": role, "content": content,
                         **{k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None}})
    return _common(data, "chat", (rendered,), ignored)


def check_token_ids(call: GenerateCall, n_vocab: int) -> None:
    """logit_bias and stop_token_ids name tokens of this model's vocabulary (a 400 otherwise, not a
    silent no-op)."""
    bad = [t for t in call.sampling.get("logit_bias", {}) if t >= n_vocab]
    if bad:
        raise bad_request(f"Invalid 'logit_bias': token ids must be < {n_vocab} (the vocabulary), got {bad[0]}",
                          param="logit_bias", code="invalid_type")
    bad = [t for t in call.stop_token_ids if t >= n_vocab]
    if bad:
        raise bad_request(f"Invalid 'stop_token_ids': token ids must be < {n_vocab} (the vocabulary), got {bad[0]}",
                          param="stop_token_ids", code="invalid_type")


def resolve_max_tokens(call: GenerateCall, n_prompt: int, n_ctx: int) -> int:
    """No limit: the rest of the context (at least 1, so the engine names the error)."""
    return call.max_tokens if call.max_tokens is not None else max(1, n_ctx - n_prompt)


# -- responses ---------------------------------------------------------------------------


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

    def full(self, choices: Sequence[tuple], usage: dict[str, Any]) -> dict[str, Any]:
        """The whole response: one choice per (text, finish reason[, logprobs JSON]), `index` in order."""
        if self.kind == "chat":
            out = [{"index": i, "message": {"role": "assistant", "content": c[0], "refusal": None},
                    "logprobs": c[2] if len(c) > 2 else None, "finish_reason": finish_reason(c[1])}
                   for i, c in enumerate(choices)]
            return {**self._head("chat.completion"), "choices": out, "usage": usage}
        out = [{"index": i, "text": c[0], "logprobs": c[2] if len(c) > 2 else None, "finish_reason": finish_reason(c[1])}
               for i, c in enumerate(choices)]
        return {**self._head("text_completion"), "choices": out, "usage": usage}

    def chunk(self, text: str, reason: str | None = None, *, first: bool = False,
              include_usage: bool = False, index: int = 0, logprobs: Any = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason(reason)}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(reason)}
            out = {**self._head("text_completion"), "choices": [choice]}
        if include_usage:
            out["usage"] = None  # OpenAI: null on every chunk but the usage-only last one
        return out

    def text_event_encoder(self, include_usage: bool, index: int = 0) -> Callable[[str, bool], bytes]:
        """(text, first) -> one SSE event carrying a content chunk of choice `index`, as bytes. The JSON
        around the text is rendered once per choice, so a streamed token costs one string escape, not a
        dict and a dump."""
        mark = "\x00skippy-text\x00"

        def halves(first: bool) -> tuple[bytes, bytes]:
            head, sep, tail = json.dumps(self.chunk(mark, first=first, include_usage=include_usage,
                                                    index=index)).partition(json.dumps(mark))
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


def models_json(names: Sequence[str], created: int, n_ctx: int | None = None,
                meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """/v1/models: every name the model answers to, with its context length as vLLM (`max_model_len`)
    and llama-server (`meta`) report it."""
    extra: dict[str, Any] = {}
    if n_ctx is not None:
        extra["max_model_len"] = n_ctx
    if meta:
        extra["meta"] = dict(meta)
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "skippy", "root": names[0], **extra}
                     for n in names]}
