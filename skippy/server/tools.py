"""OpenAI function tools, pure: the request's `tools` / `tool_choice` validated, the grammar that forces a
call (`tool_choice: required` or a named function), and tool calls parsed out of generated text.

Formats (chosen from the chat template's text, as llama.cpp's common chat code detects them):
- `hermes` (Hermes 2 Pro, Qwen 2.5/3, and every template that knows nothing of tools: skippy.chat_template
  describes the tools in that convention): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one per call;
- `llama3` (Llama 3.1+ JSON tool calling): the whole answer is `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`;
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (the marker is a control token, so
  the text may hold only the JSON array).
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

import attrs

from . import tool_stream
from .api_errors import bad_request

FORMATS = ("hermes", "llama3", "mistral")


@attrs.frozen
class ToolSpec:
    tools: tuple[dict, ...]  # OpenAI tool objects ({"type": "function", "function": {...}})
    choice: str  # "auto" | "none" | "required" | "function" (a named one)
    name: str | None = None  # the named function
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def active(self) -> bool:
        """Whether the output may hold calls (and is parsed for them)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    def params_of(self, name: str) -> dict:
        for t in self.tools:
            if t["function"]["name"] == name:
                return t["function"].get("parameters") or {"type": "object", "properties": {}}
        raise KeyError(name)


_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def parse_tools(data: Mapping[str, Any]) -> ToolSpec | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat request (None: no tools asked)."""
    tools = data.get("tools")
    choice = data.get("tool_choice")
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request(f"Invalid 'parallel_tool_calls': expected a boolean, got {parallel!r}",
                          param="parallel_tool_calls", code="invalid_type")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array of function tools", param="tools", code="invalid_type")
    checked = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(fn, dict)):
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}",
                              param="tools", code="invalid_type")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"tools[{i}].function.name must match [A-Za-z0-9_.-]{{1,64}}, got {name!r}",
                              param="tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              param="tools", code="invalid_type")
        checked.append({"type": "function", "function": dict(fn)})
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise bad_request("tool function names must be unique", param="tools")
    name = None
    if choice is None:
        kind = "auto"
    elif choice in ("auto", "none", "required"):
        kind = choice
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and isinstance(choice["function"].get("name"), str)):
        kind, name = "function", choice["function"]["name"]
        if name not in names:
            raise bad_request(f"'tool_choice' names the function {name!r}, which is not in 'tools'",
                              param="tool_choice")
    else:
        raise bad_request(f"Invalid 'tool_choice': expected 'auto', 'none', 'required' or "
                          f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {choice!r:.200}",
                          param="tool_choice", code="invalid_type")
    return ToolSpec(tuple(checked), kind, name, True if parallel is None else parallel)


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Tool calls in the history: an assistant's `tool_calls` and a tool result's `tool_call_id`."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls is not None:
            if m.get("role") != "assistant" or not isinstance(calls, list):
                raise bad_request(f"messages[{i}].tool_calls: only an assistant message carries an array of calls",
                                  param=f"messages[{i}].tool_calls", code="invalid_type")
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                        and isinstance(fn.get("arguments", ""), (str, dict))):
                    raise bad_request(f"messages[{i}].tool_calls[{j}] must have function.name and function.arguments",
                                      param=f"messages[{i}].tool_calls[{j}]", code="invalid_type")


def template_format(source: str | None) -> str:
    """The tool-call convention of a chat template (hermes when it has none of its own)."""
    s = source or ""
    if "[TOOL_CALLS]" in s:
        return "mistral"
    if "<tool_call>" in s:
        return "hermes"
    if "<|python_tag|>" in s or ("ipython" in s and "parameters" in s):
        return "llama3"
    return "hermes"


# -- the forcing grammar ------------------------------------------------------------------------


def _call_schema(spec: ToolSpec, fmt: str) -> dict:
    key = "parameters" if fmt == "llama3" else "arguments"
    names = [spec.name] if spec.choice == "function" else list(spec.names)
    options = [{"type": "object", "properties": {"name": {"const": n}, key: spec.params_of(n)},
                "required": ["name", key], "additionalProperties": False} for n in names]
    return options[0] if len(options) == 1 else {"anyOf": options}


def forcing_grammar(spec: ToolSpec, fmt: str) -> str:
    """Lark (llguidance) for `tool_choice` required / named: the output is one call (several when
    parallel calls are allowed and no function is named) in the template's format, nothing else."""
    schema = json.dumps(_call_schema(spec, fmt))
    many = spec.parallel and spec.choice != "function"
    if fmt == "hermes":
        rest = ' ("\\n" tool_call)*' if many else ""
        return (f'start: tool_call{rest}\n'
                f'tool_call: "<tool_call>\\n" call "\\n</tool_call>"\n'
                f"call: %json {schema}\n")
    if fmt == "mistral":
        return f'start: "[" call ("," call)* "]"\ncall: %json {schema}\n' if many else \
            f'start: "[" call "]"\ncall: %json {schema}\n'
    return f"start: call\ncall: %json {schema}\n"  # llama3: one JSON call


# -- parsing calls out of the text --------------------------------------------------------------


def parse_calls(text: str, fmt: str, names: Sequence[str]) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a generated answer: the text around the calls is the content (None when
    nothing is left). Text that does not parse as a call of a known function stays content. The same
    parser streams calls (server.tool_stream), so streamed argument fragments join to these `arguments`:
    the model's own JSON text. Every format is recognised whatever `fmt` (a model may use another's)."""
    return tool_stream.parse(text, names)
