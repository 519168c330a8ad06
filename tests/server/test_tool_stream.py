"""Streamed tool calls: the incremental parser (pure) and streamed vs non-streamed calls on a live server."""

from __future__ import annotations

import json
import random

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy.server.tool_stream import ArgsDelta, CallParser, CallStart, Content, parse

from ._live import live_server

NAMES = ["add", "get_weather"]
CASES = [  # (text, content, [(name, arguments)])
    (('Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
      '<tool_call>{"name": "add", "arguments": {"a":2}}</tool_call>'), "Sure.", [("add", '{"a": 1}'), ("add", '{"a":2}')]),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 1}}', None, [("add", '{"a": 1}')]),
    ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {}}]', None,
     [("add", '{"a": 1}'), ("get_weather", "{}")]),
    ('[{"name": "add", "arguments": {"a": 1}}] and more', "and more", [("add", '{"a": 1}')]),
    ('{"arguments": {"s": "a}\\"{b", "l": [1, {"x": "]"}]}, "name": "get_weather"}', None,
     [("get_weather", '{"s": "a}\\"{b", "l": [1, {"x": "]"}]}')]),
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call>', None, [("add", '{"a": 3}')]),
    ('{"type": "function", "name": "add", "parameters": {"x": "\\u00e9"}, "extra": [1, {"}": 2}]}', None,
     [("add", '{"x": "\\u00e9"}')]),
    ('{"name": "add"}', None, [("add", "{}")]),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call> then <tool_call>{"name": "add", "arguments": {}}',
     '<tool_call>{"name": "nope", "arguments": {}}</tool_call> then', [("add", "{}")]),
    # not calls: the text comes back unchanged
    ('{"name": "rm", "arguments": {}}', None, []),
    ('{"title": "a JSON answer"}', None, []),
    ("[1, 2]", None, []),
    ("  a plain answer, 1 < 2 <tool\n", None, []),
    ("[", None, []),
    ("", None, []),
]


def _run(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], list]:
    """Feed `text` in the pieces `cuts` makes: (content, [(name, arguments)], events)."""
    p = CallParser(NAMES)
    events, pos = [], 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[pos:c])
        pos = c
    events += p.finish()
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_")
            calls[e.index] = [e.name, ""]
        elif isinstance(e, ArgsDelta):
            calls[e.index][1] += e.text
    content = "".join(e.text for e in events if isinstance(e, Content))
    return content, [tuple(v) for v in calls.values()], events  # type: ignore[misc]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_parser_gives_the_same_calls_whatever_the_pieces(text, content, calls):
    got_content, got_calls = parse(text, NAMES)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
    assert got_content == (content if calls else text)
    whole = _run(text, [])[:2]
    assert whole == ((content or "") if calls else text, calls)
    rng = random.Random(text)
    splits = [list(range(1, len(text)))]  # one character at a time, as a slow tokenizer would
    splits += [sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) for _ in range(50)] if text else []
    for cuts in splits:
        assert _run(text, cuts)[:2] == whole, cuts


BASES = [
    'Sure. <tool_call>\n{"name": "add", "arguments": {"a": "x}\\"", "b": [1, {"c": 2}]}}\n</tool_call> ok '
    '<tool_call>{"name":"add","arguments":"{\\"q\\": 1}"}</tool_call>',
    '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"type": "function", "name": "add", "parameters": {}, '
    '"x": [1]}] tail',
    ' <|python_tag|>{"arguments": {"a": 1}, "name": "add", "z": null}\n rest',
]
PIECES = ['{', '}', '[', ']', '"', '\\', ':', ',', ' ', '\n', 'name', '"add"', '"arguments"', '<tool_call>',
          '</tool_call>', '<tool', '[TOOL_CALLS]', '1']


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mangled_calls_parse_the_same_in_any_pieces(data):
    """Near-calls (characters deleted, inserted, replaced): the pieces never change the outcome, and an
    answer with no call comes back unchanged."""
    text = list(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(0, 3))):
        j = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["del", "ins", "set"]))
        piece = data.draw(st.sampled_from(PIECES))
        if op == "del":
            del text[j]
        elif op == "ins":
            text.insert(j, piece)
        else:
            text[j] = piece
    s = "".join(text)
    whole = _run(s, [])[:2]
    if not whole[1]:
        assert whole[0] == s
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(s) - 1)), max_size=len(s))))
    assert _run(s, [c for c in cuts if c < len(s)])[:2] == whole


def test_content_streams_before_a_call_and_arguments_stream_as_they_come():
    p = CallParser(NAMES)
    assert p.feed("Let me check") == [Content("Let me check")]
    assert p.feed(" <tool") == []  # may begin a tag: held (and the space before it)
    assert p.feed('_call>\n{"name": "get_w') == []
    start = p.feed('eather", "arguments": {"ci')
    assert isinstance(start[0], CallStart) and start[0].name == "get_weather" and start[1] == ArgsDelta(0, '{"ci')
    assert p.feed('ty": "Paris"') == [ArgsDelta(0, 'ty": "Paris"')]
    assert p.feed("}}\n</tool_call>") == [ArgsDelta(0, "}")]
    assert p.finish() == []
    p = CallParser(NAMES)
    assert p.feed('{"name": "rm"') == [Content('{"name": "rm"')]  # an unknown function: released at once


def test_the_parser_is_linear_in_the_output():
    """Each piece is scanned once: 8x the arguments cost about 8x the time, not 64x."""
    import time

    def cost(n: int) -> float:
        text = '<tool_call>{"name": "add", "arguments": {"t": "' + "ab\\\"{" * n + '"}}</tool_call>'
        pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            p = CallParser(NAMES)
            for piece in pieces:
                p.feed(piece)
            p.finish()
            best = min(best, time.perf_counter() - t0)
        return best

    assert cost(4000) < 20 * cost(500)


# -- live: streamed deltas against the non-streamed answer -------------------------------------------

MODEL = "test-model"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def _shot(question: str, a: int, b: int) -> list[dict]:
    """One earlier exchange in the history: the question, the assistant's add call, its result, the answer."""
    cid = f"call_{a}_{b}"
    call = {"id": cid, "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}
    return [{"role": "user", "content": question}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": cid, "content": str(a + b)},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]


async def _both(http: httpx.AsyncClient, body: dict) -> tuple[list, list, int]:
    """(non-streamed choices, streamed choices, argument deltas seen): each choice as (content,
    [(name, arguments)], finish_reason)."""
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    full = [(c["message"]["content"], [(t["function"]["name"], t["function"]["arguments"])
                                       for t in c["message"].get("tool_calls") or []], c["finish_reason"])
            for c in r.json()["choices"]]
    k = len(full)
    content: list[list[str]] = [[] for _ in range(k)]
    calls: list[dict[int, list[str]]] = [{} for _ in range(k)]
    reasons: list[str | None] = [None] * k
    pieces = 0
    async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        async for line in s.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            i, delta = choice["index"], choice["delta"]
            reasons[i] = choice["finish_reason"] or reasons[i]
            content[i].append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                if tc["index"] not in calls[i]:  # the call's first delta: id, type, name, empty arguments
                    assert tc["id"].startswith("call_") and tc["type"] == "function"
                    assert tc["function"]["arguments"] == ""
                    calls[i][tc["index"]] = [tc["function"]["name"], ""]
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                    calls[i][tc["index"]][1] += tc["function"]["arguments"]
                    pieces += 1
    streamed = [("".join(content[i]) or None, [tuple(calls[i][j]) for j in sorted(calls[i])], reasons[i])
                for i in range(k)]
    return full, streamed, pieces


@pytest.mark.server
async def test_streamed_tool_calls_equal_the_non_streamed_ones(smollm2):
    ask = [{"role": "user", "content": "What is the weather in Paris, in celsius? Use a tool."}]
    base = {"model": MODEL, "messages": ask, "tools": [WEATHER, ADD], "max_tokens": 96, "temperature": 0.8}
    with trio.fail_after(300):
        async with live_server(smollm2, n_ctx=4096) as (url, _, _):
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                for seed in (1, 2):  # forced: every choice is a call, its arguments streamed in pieces
                    full, streamed, pieces = await _both(http, {**base, "tool_choice": "required", "seed": seed,
                                                                "n": 2})
                    assert streamed == full, seed
                    assert pieces > 2 * len(full), pieces  # the arguments came as fragments, not whole
                    for content, calls, reason in full:
                        assert calls and reason == "tool_calls" and content is None
                        for _name, args in calls:
                            assert isinstance(json.loads(args), dict)
                called = 0
                shown = [*_shot("What is 1 + 1?", 1, 1), *_shot("What is 4 + 7?", 4, 7),
                         {"role": "user", "content": "What is 2 + 3?"}]  # earlier calls teach the small model
                for seed in range(4):  # auto: whatever the model chose (content or calls) is the same streamed
                    full, streamed, _ = await _both(http, {**base, "messages": shown, "tool_choice": "auto",
                                                        "max_tokens": 60, "seed": seed})
                    assert streamed == full, seed
                    called += bool(full[0][1])
                assert called, "SmolLM2 called no tool in four tries with tool_choice auto"
