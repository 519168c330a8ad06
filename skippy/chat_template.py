"""Chat templates rendered with Jinja, as Hugging Face and llama.cpp's `--jinja` render them.

The GGUF's `tokenizer.chat_template` runs in jinja2's ImmutableSandboxedEnvironment with the helpers
HF templates use (`raise_exception`, `tojson`, `strftime_now`, `bos_token`, `eos_token`, loop
controls), `tools` and `add_generation_prompt` set and any `chat_template_kwargs` passed through
(e.g. `enable_thinking`). A model without a template, or with one this environment cannot compile,
falls back to llama.cpp's built-in renderer (`Model.apply_chat_template`: the known template families,
chatml by default), which renders role and text only.

A template that does not mention tools (SmolLM2's) still gets them: their JSON schemas and the
Hermes `<tool_call>` convention go into the system message, and earlier tool calls and results are
written back into the history in that convention, so every model can take part in a tool exchange.
"""

from __future__ import annotations

import datetime
import json
from functools import lru_cache
from typing import Any, Mapping, Sequence

from loguru import logger

from .errors import InvalidInputError


class TemplateError(InvalidInputError):
    """The chat template refused these messages (its own raise_exception, or a render error)."""


def _raise(message: str) -> None:
    raise TemplateError(str(message))


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False,
            separators: Any = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=tuple(separators) if separators else None)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    """The template compiled once per source text (raises jinja2's TemplateSyntaxError)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


# -- tools for templates that know nothing of them --------------------------------------------------

HERMES_PREAMBLE = (
    "You may call one or more functions to assist with the user query. Here are the available tools, "
    "as JSON schemas:\n<tools>\n{tools}\n</tools>\n\nTo call a function, answer with a JSON object with its "
    "name and arguments inside <tool_call></tool_call> tags, one per call:\n<tool_call>\n"
    "{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)


def knows_tools(source: str | None) -> bool:
    return bool(source) and "tools" in source  # type: ignore[operator]


def knows_tool_calls(source: str | None) -> bool:
    return bool(source) and "tool_calls" in source  # type: ignore[operator]


def _arguments(args: Any) -> Any:
    """OpenAI sends arguments as a JSON string; templates expect the object (as llama.cpp passes it)."""
    if isinstance(args, str):
        try:
            value = json.loads(args)
        except ValueError:
            return args
        return value
    return args


def _for_template(messages: Sequence[Mapping[str, Any]], source: str | None,
                  tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages as the template expects them: tool call arguments as objects; for a template that does
    not render tools, the tools described in the system message and calls/results written as text."""
    native_calls = knows_tool_calls(source)
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        calls = msg.get("tool_calls")
        if calls:
            calls = [{**c, "function": {**c.get("function", {}),
                                        "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                     for c in calls]
            msg["tool_calls"] = calls
            if not native_calls:
                text = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"].get("name"),
                                                               "arguments": c["function"].get("arguments")})
                                 + "\n</tool_call>" for c in calls)
                msg["content"] = ((msg.get("content") or "") + ("\n" if msg.get("content") else "") + text)
                del msg["tool_calls"]
        if msg.get("content") is None:
            msg["content"] = ""
        if msg.get("role") == "tool" and not native_calls:
            msg["content"] = f"<tool_response>\n{msg['content']}\n</tool_response>"
        out.append(msg)
    if tools and not knows_tools(source):
        preamble = HERMES_PREAMBLE.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{preamble}"}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out


# -- rendering ----------------------------------------------------------------------------------------


def render(model: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
           add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None,
           template: str | None = None) -> str:
    """The prompt text of `messages` through the model's chat template (Jinja), or llama.cpp's built-in
    renderer when the model has none or Jinja cannot compile it. TemplateError when the template refuses."""
    source = template if template is not None else model.chat_template
    msgs = _for_template(messages, source, tools)
    compiled = None
    if source:
        try:
            compiled = _compile(source)
        except Exception as exc:  # a template this environment cannot compile: llama.cpp's renderer
            logger.warning("the chat template does not compile with Jinja ({}); using llama.cpp's renderer", exc)
    if compiled is None:
        return model.apply_chat_template([{"role": m["role"], "content": str(m.get("content") or "")} for m in msgs],
                                         add_assistant=add_generation_prompt, template=template)
    tok = model.tokenizer
    context: dict[str, Any] = {
        "bos_token": _special_text(tok, tok.bos), "eos_token": _special_text(tok, tok.eos),
        **dict(template_kwargs or {}),
        "messages": msgs, "add_generation_prompt": add_generation_prompt,
    }
    if tools:
        context["tools"] = list(tools)
    try:
        return compiled.render(**context)
    except TemplateError:
        raise
    except Exception as exc:  # jinja2's UndefinedError, TypeError from a template's arithmetic, ...
        raise TemplateError(f"the chat template could not render these messages: {exc}") from None


def _special_text(tok: Any, token: int) -> str:
    if token is None or token < 0:
        return ""
    return tok.piece(token, special=True).decode("utf-8", "replace")


def strip_bos(model: Any, text: str) -> str:
    """Drop a leading BOS the template wrote when the tokenizer adds one itself (no double BOS)."""
    tok = model.tokenizer
    if tok.add_bos and tok.bos >= 0:
        bos = _special_text(tok, tok.bos)
        if bos and text.startswith(bos):
            return text[len(bos):]
    return text
