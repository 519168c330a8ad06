"""Request fields, read the way vLLM reads them: every field we know is validated strictly (a
wrong type or value is a 400 naming it), every field we do not know is accepted and ignored
(logged once per name, and listed back in the `x-skippy-ignored-fields` response header), so a
client written for another server keeps working. llama-server's names are aliases where they
mean the same thing (`n_predict`, `repeat_penalty`). Pure: no engine, no HTTP.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable, Mapping

from loguru import logger

from .api_errors import bad_request

MAX_STOPS = 64  # stop strings per request (OpenAI allows 4; vLLM and llama-server any number)
MAX_STOP_CHARS = 256  # each one's length: a stop string is held back from the stream while it may match
MAX_PROMPTS = 128  # prompts in one /v1/completions request (one choice each)
MAX_CHOICES = 128  # choices in one request: prompts x n (each takes a lane)
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's limit)
MAX_LOGIT_BIAS = 1024  # entries in logit_bias
BIAS_LIMIT = 100.0  # logit_bias values are clamped to [-100, 100] (OpenAI's range)
IGNORED_HEADER = "x-skippy-ignored-fields"


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    # an int is finite however large (math.isfinite would overflow converting it to a float)
    return is_int(v) or isinstance(v, float) and math.isfinite(v)


def want(data: Mapping[str, Any], name: str, ok: Callable[[Any], bool], what: str, default: Any = None) -> Any:
    """data[name] if present and `ok`, `default` if absent or null, else a 400 naming `name`."""
    v = data.get(name)
    if v is None:
        return default
    if not ok(v):
        raise bad_request(f"Invalid type or value for '{name}': expected {what}, got {v!r}", param=name,
                          code="invalid_type")
    return v


def one_of(data: Mapping[str, Any], names: Iterable[str]) -> str | None:
    """The one name of `names` (aliases of one field) given a non-null value; a 400 if several are."""
    given = [n for n in names if data.get(n) is not None]
    if len(given) > 1:
        raise bad_request(f"Give only one of {', '.join(repr(n) for n in given)} (they are the same field)",
                          param=given[1], code="conflicting_parameters")
    return given[0] if given else None


# -- which fields exist --------------------------------------------------------------------

# known but not implemented (or not for this endpoint: `echo` in chat, `top_logprobs` in completions):
# accepted at their neutral value only, a 400 naming them otherwise
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "best_of": lambda v: v == 1 and is_int(v),
    "echo": lambda v: v is False,
    "top_logprobs": lambda v: v == 0 and is_int(v),
    "n_probs": lambda v: v == 0 and is_int(v),  # llama-server's logprobs
    "suffix": lambda v: v == "",
    "parallel_tool_calls": lambda v: isinstance(v, bool),
    "tool_choice": lambda v: v == "none",
    "tools": lambda v: v == [],
    "functions": lambda v: v == [],
    "response_format": lambda v: isinstance(v, dict) and v.get("type") == "text",
    "grammar": lambda v: v == "",
    "json_schema": lambda v: v == {},
    "store": lambda v: v is False,
    "modalities": lambda v: v == ["text"],
}
# known, accepted with no effect: metadata, and cache hints the prefix cache makes moot
NO_EFFECT = {"user", "metadata", "service_tier", "reasoning_effort", "cache_prompt", "id_slot", "n_keep",
             "skip_special_tokens", "spaces_between_special_tokens"}
COMMON = {"model", "max_tokens", "n_predict", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
          "stream_options", "ignore_eos", "priority", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "repeat_penalty", "repeat_last_n", "logit_bias", "n", "logprobs", "typical_p",
          "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta",  # llama-server's
          "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
          "min_tokens", "stop_token_ids", "include_stop_str_in_output"}  # vLLM's
# structured output and tools: read by server.structured (known here, so never the neutral-only check;
# tools stay neutral-only in completions)
COMMON |= {"response_format", "grammar", "json_schema"}
COMPLETION = COMMON | {"prompt", "echo"}
CHAT = COMMON | {"messages", "max_completion_tokens", "top_logprobs",
                "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"}

_logged: set[str] = set()
_LOG_NAMES = 256  # names remembered for "logged once"; past that, new ones go unlogged (a client cannot grow it)


def check_fields(data: Mapping[str, Any], known: set[str]) -> tuple[str, ...]:
    """Validate the neutral-only fields; return the unknown ones' names (ignored, logged once each)."""
    ignored = []
    for name, value in data.items():
        if name in known or name in NO_EFFECT:
            continue
        neutral = NEUTRAL.get(name)
        if neutral is None:
            ignored.append(name)
        elif value is not None and not neutral(value):
            raise bad_request(f"'{name}' is not supported by this server (only its default value is accepted); "
                              f"got {value!r}", param=name, code="unsupported_parameter")
    for name in ignored:
        log_ignored(name)
    return tuple(ignored)


def log_ignored(name: str) -> None:
    if name in _logged or len(_logged) >= _LOG_NAMES:
        return
    _logged.add(name)
    logger.info("ignoring the unknown request field {!r} (accepted, no effect; logged once)", name)


_HEADER_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-\[\]]")


def ignored_header(names: Iterable[str]) -> dict[str, str]:
    """The response header listing ignored fields (header-safe: odd characters become '?', at most 32 names)."""
    safe = [_HEADER_UNSAFE.sub("?", n[:64]) for n in names][:32]
    return {IGNORED_HEADER: ", ".join(safe)} if safe else {}


# -- the fields ----------------------------------------------------------------------------


def max_tokens(data: Mapping[str, Any], kind: str) -> tuple[int | None, bool]:
    """(limit, given): `max_tokens`, or its aliases `max_completion_tokens` (chat) and `n_predict`
    (llama-server's, where -1 means no limit: the rest of the context)."""
    names = ("max_tokens", "max_completion_tokens", "n_predict") if kind == "chat" else ("max_tokens", "n_predict")
    name = one_of(data, names)
    if name is None:
        return None, False
    if name == "n_predict":
        v = want(data, name, lambda v: is_int(v) and (v >= 1 or v == -1), "an integer >= 1, or -1 (no limit)")
        return (None if v == -1 else v), True
    if kind == "completion":  # 0: with echo, score the prompt and generate nothing (lm-eval's loglikelihood)
        return want(data, name, lambda v: is_int(v) and v >= 0, "an integer >= 0"), True
    return want(data, name, lambda v: is_int(v) and v >= 1, "an integer >= 1"), True


def n_choices(data: Mapping[str, Any]) -> int:
    return want(data, "n", lambda v: is_int(v) and 1 <= v <= MAX_CHOICES, f"an integer in [1, {MAX_CHOICES}]", 1)


def logprobs(data: Mapping[str, Any], kind: str) -> int | None:
    """Alternatives per token, or None when no logprobs are asked: completions' `logprobs: k`, chat's
    `logprobs: true` with `top_logprobs: k`."""
    if kind == "completion":
        if data.get("logprobs") is False:
            return None
        return want(data, "logprobs", lambda v: is_int(v) and 0 <= v <= MAX_LOGPROBS,
                    f"an integer in [0, {MAX_LOGPROBS}]")
    asked = bool(want(data, "logprobs", lambda v: isinstance(v, bool) or v in (0, 1) and is_int(v), "a boolean",
                      False))  # 0 and 1 too, as pydantic (vLLM) reads a boolean
    top = want(data, "top_logprobs", lambda v: is_int(v) and 0 <= v <= MAX_LOGPROBS,
               f"an integer in [0, {MAX_LOGPROBS}]")
    if top is not None and not asked:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if asked else None


def echo(data: Mapping[str, Any]) -> bool:
    return want(data, "echo", lambda v: isinstance(v, bool), "a boolean", False)


def sampling(data: Mapping[str, Any]) -> dict[str, Any]:
    """SamplingParams fields. Penalties and logit_bias appear only when given, so the neutral request's
    dict is what it always was."""
    seed = want(data, "seed", lambda v: is_int(v) and v >= -1, "an integer >= 0 (or -1: no seed)")
    top_k = want(data, "top_k", lambda v: is_int(v) and v >= -1, "an integer >= 0 (0 or -1: off)", 0)
    out: dict[str, Any] = {
        "temperature": float(want(data, "temperature", lambda v: is_num(v) and 0 <= v <= 2, "a number in [0, 2]", 1.0)),
        "top_p": float(want(data, "top_p", lambda v: is_num(v) and 0 < v <= 1, "a number in (0, 1]", 1.0)),
        "top_k": max(top_k, 0),
        "min_p": float(want(data, "min_p", lambda v: is_num(v) and 0 <= v <= 1, "a number in [0, 1]", 0.0)),
        "seed": None if seed == -1 else seed,
    }
    typical = want(data, "typical_p", lambda v: is_num(v) and 0 < v <= 1, "a number in (0, 1]", 1.0)
    if typical < 1:
        out["typical_p"] = float(typical)
    xtc = want(data, "xtc_probability", lambda v: is_num(v) and 0 <= v <= 1, "a number in [0, 1]", 0.0)
    threshold = want(data, "xtc_threshold", lambda v: is_num(v) and 0 <= v <= 1, "a number in [0, 1]", 0.1)
    if xtc > 0:
        out["xtc_probability"], out["xtc_threshold"] = float(xtc), float(threshold)
    mirostat = want(data, "mirostat", lambda v: is_int(v) and v in (0, 1, 2), "0, 1 or 2", 0)
    tau = want(data, "mirostat_tau", lambda v: is_num(v) and v >= 0, "a number >= 0", 5.0)
    eta = want(data, "mirostat_eta", lambda v: is_num(v) and v >= 0, "a number >= 0", 0.1)
    if mirostat:
        out.update(mirostat=mirostat, mirostat_tau=float(tau), mirostat_eta=float(eta))
    out.update(dry(data))
    for name in ("presence_penalty", "frequency_penalty"):
        v = want(data, name, lambda v: is_num(v) and -2 <= v <= 2, "a number in [-2, 2]")
        if v is not None:
            out[name] = float(v)
    rep = one_of(data, ("repetition_penalty", "repeat_penalty"))
    if rep is not None:
        out["repeat_penalty"] = float(want(data, rep, lambda v: is_num(v) and 0 < v <= 10, "a number in (0, 10]"))
    last_n = want(data, "repeat_last_n", lambda v: is_int(v) and v >= -1, "an integer >= -1 (0: off, -1: all)")
    if last_n is not None:
        out["repeat_last_n"] = last_n
    bias = logit_bias(data.get("logit_bias"))
    if bias:
        out["logit_bias"] = bias
    return out


MAX_BREAKERS = 64  # DRY sequence breakers per request (each one is a scan of the vocabulary, once)


def dry(data: Mapping[str, Any]) -> dict[str, Any]:
    """llama-server's DRY fields, as it reads them: on when dry_multiplier > 0; a dry_base under 1 is
    its default 1.75; dry_sequence_breakers a non-empty list of strings. Nothing when off."""
    multiplier = want(data, "dry_multiplier", lambda v: is_num(v) and v >= 0, "a number >= 0", 0.0)
    base = want(data, "dry_base", is_num, "a number", 1.75)
    allowed = want(data, "dry_allowed_length", lambda v: is_int(v) and v >= 0, "an integer >= 0", 2)
    last_n = want(data, "dry_penalty_last_n", lambda v: is_int(v) and v >= -1, "an integer >= -1 (0: off, -1: all)",
                  64)
    breakers = want(data, "dry_sequence_breakers",
                    lambda v: isinstance(v, list) and 0 < len(v) <= MAX_BREAKERS and all(isinstance(b, str) for b in v),
                    f"a non-empty array of at most {MAX_BREAKERS} strings", None)
    if not multiplier:
        return {}
    out: dict[str, Any] = {"dry_multiplier": float(multiplier), "dry_base": float(base) if base >= 1 else 1.75,
                           "dry_allowed_length": allowed, "dry_penalty_last_n": last_n}
    if breakers is not None:
        out["dry_sequence_breakers"] = tuple(breakers)
    return out


def logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's {"token id": bias} or llama-server's [[token id, bias or false], ...]; biases clamped
    to [-100, 100], false (llama-server: never this token) is -inf."""
    if value is None:
        return {}
    if isinstance(value, dict):
        items: list[Any] = list(value.items())
    elif isinstance(value, list):
        items = value
    else:
        raise _bad_bias(f"expected an object of token id -> bias, got {value!r}")
    if len(items) > MAX_LOGIT_BIAS:
        raise _bad_bias(f"at most {MAX_LOGIT_BIAS} entries, got {len(items)}")
    out: dict[int, float] = {}
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise _bad_bias(f"entries are [token id, bias], got {item!r}")
        key, bias = item
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key
        if not (is_int(token) and token >= 0):
            raise _bad_bias(f"keys must be token ids (integers >= 0), got {key!r}")
        if bias is False:
            out[token] = -math.inf
        elif is_num(bias):
            out[token] = float(min(BIAS_LIMIT, max(-BIAS_LIMIT, bias)))
        else:
            raise _bad_bias(f"values must be numbers, got {bias!r}")
    return out


def _bad_bias(detail: str):
    return bad_request(f"Invalid 'logit_bias': {detail}", param="logit_bias", code="invalid_type")


def stops(data: Mapping[str, Any]) -> tuple[str, ...]:
    stop = data.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not (isinstance(items, list) and len(items) <= MAX_STOPS
            and all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in items)):
        raise bad_request(f"Invalid type or value for 'stop': expected a string or up to {MAX_STOPS} strings of at "
                          f"most {MAX_STOP_CHARS} characters, got {stop!r:.200}", param="stop", code="invalid_type")
    return tuple(dict.fromkeys(s for s in items if s))


MAX_STOP_IDS = 1024  # stop_token_ids per request


def stop_token_ids(data: Mapping[str, Any]) -> tuple[int, ...]:
    """vLLM's `stop_token_ids` (their range against the vocabulary is checked with the prompt's ids)."""
    ids = want(data, "stop_token_ids", lambda v: isinstance(v, list) and len(v) <= MAX_STOP_IDS
               and all(is_int(t) and t >= 0 for t in v), f"a list of up to {MAX_STOP_IDS} token ids", [])
    return tuple(dict.fromkeys(ids))


def min_tokens(data: Mapping[str, Any], limit: int | None) -> int:
    """vLLM's `min_tokens`: at most max_tokens (a 400, as vLLM's, past it)."""
    n = want(data, "min_tokens", lambda v: is_int(v) and v >= 0, "an integer >= 0", 0)
    if limit is not None and n > limit:
        raise bad_request(f"'min_tokens' ({n}) must be at most 'max_tokens' ({limit})", param="min_tokens")
    return n


def stream_options(data: Mapping[str, Any], stream: bool) -> tuple[bool, tuple[str, ...]]:
    """(include_usage, ignored sub-fields) of `stream_options`."""
    opts = want(data, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    if not isinstance(opts.get("include_usage", False), bool):
        raise bad_request(f"Invalid 'stream_options.include_usage': {opts['include_usage']!r}",
                          param="stream_options", code="invalid_type")
    if opts and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    ignored = tuple(f"stream_options.{k}" for k in opts if k != "include_usage")
    for name in ignored:
        log_ignored(name)
    return bool(opts.get("include_usage", False)), ignored


def completion_prompts(value: Any) -> tuple[str | list[int], ...]:
    """/v1/completions' `prompt`: a string, token ids, or a list of either (one choice each)."""
    if isinstance(value, str):
        if not value:
            raise bad_request("'prompt' must not be empty", param="prompt")
        return (value,)
    if not isinstance(value, list) or not value:
        raise bad_request(f"'prompt' must be a non-empty string, token ids, or a list of either; got {value!r:.200}",
                          param="prompt", code="missing_required_parameter" if value is None else "invalid_type")
    if all(is_int(t) for t in value):
        return (value,)
    if len(value) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}", param="prompt")
    if all(isinstance(p, str) for p in value) or all(isinstance(p, list) for p in value):
        for i, p in enumerate(value):
            if not p or isinstance(p, list) and not all(is_int(t) for t in p):
                raise bad_request(f"prompt[{i}] must be a non-empty string or a non-empty list of token ids",
                                  param="prompt", code="invalid_type")
        return tuple(value)
    raise bad_request("'prompt' must be a string, token ids, a list of strings or a list of token-id lists "
                      "(not a mix)", param="prompt", code="invalid_type")
