"""Structured output and tool calls against a live server on the default model (SmolLM2)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import trio

from ._live import in_thread, live_server, openai_client

pytestmark = pytest.mark.server

MODEL = "test-model"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                 "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags", "home"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"]}}}


def _fmt(schema=PERSON):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


async def test_json_schema_streamed_and_not_under_concurrency_equals_alone(smollm2):
    with trio.fail_after(240):
        async with live_server(smollm2, n_ctx=4096) as (url, _, _):
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                async def full(seed):
                    r = await http.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": MESSAGES, "max_tokens": 200, "temperature": 0.9, "seed": seed,
                        "response_format": _fmt()})
                    assert r.status_code == 200, r.text
                    choice = r.json()["choices"][0]
                    return choice["message"]["content"], choice["finish_reason"]

                async def streamed(seed):
                    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 200, "temperature": 0.9, "seed": seed,
                            "response_format": _fmt(), "stream": True}
                    text, reason = [], None
                    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200
                        async for line in r.aiter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                chunk = json.loads(line[6:])
                                delta = chunk["choices"][0]["delta"]
                                text.append(delta.get("content") or "")
                                reason = chunk["choices"][0]["finish_reason"] or reason
                    return "".join(text), reason

                results: dict = {}

                async def one(key, fn, seed):
                    results[key] = await fn(seed)

                async with trio.open_nursery() as nursery:
                    for seed in range(4):
                        nursery.start_soon(one, ("full", seed), full, seed)
                        nursery.start_soon(one, ("stream", seed), streamed, seed)
                for seed in range(4):
                    assert results[("full", seed)] == results[("stream", seed)]  # same seed, same bytes
                for key, (text, reason) in results.items():
                    assert reason == "stop", (key, text)
                    jsonschema.validate(json.loads(text), PERSON)
                assert await full(2) == results[("full", 2)]  # alone: the same bytes as under load


async def test_openai_sdk_parse_with_a_pydantic_model(smollm2):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Home(BaseModel):
        city: str = Field(max_length=24)

    class Person(BaseModel):
        name: str = Field(max_length=24)
        age: int
        mood: Literal["happy", "sad"]
        home: Home

    with trio.fail_after(120):
        async with live_server(smollm2, n_ctx=4096) as (url, _, _):
            client = openai_client(url)
            parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
            done = await in_thread(parse, model=MODEL, messages=MESSAGES, response_format=Person, max_tokens=200,
                                   temperature=0)
            person = done.choices[0].message.parsed
            assert isinstance(person, Person) and isinstance(person.home, Home)
            assert done.choices[0].finish_reason == "stop"

            brief = [{"role": "user", "content": 'Reply with the JSON object {"ok": true}.'}]
            obj = await in_thread(client.chat.completions.create, model=MODEL, messages=brief, max_tokens=200,
                                  temperature=0, response_format={"type": "json_object"})
            assert obj.choices[0].finish_reason == "stop", obj.choices[0].message.content
            assert isinstance(json.loads(obj.choices[0].message.content), dict)


async def test_llama_server_grammar_and_json_schema_fields_on_completions(smollm2):
    with trio.fail_after(120):
        async with live_server(smollm2) as (url, _, _):
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                r = await http.post("/v1/completions", json={
                    "model": MODEL, "prompt": "Is the sky blue? Answer:", "max_tokens": 10, "temperature": 0,
                    "grammar": 'root ::= " " ("yes" | "no")'})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] in (" yes", " no")
                assert r.json()["choices"][0]["finish_reason"] == "stop"
                r = await http.post("/v1/completions", json={
                    "model": MODEL, "prompt": "A list of two numbers:", "max_tokens": 40, "temperature": 0,
                    "json_schema": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}})
                assert r.status_code == 200, r.text
                value = json.loads(r.json()["choices"][0]["text"])
                assert len(value) == 2 and all(isinstance(v, int) for v in value)


async def test_schemas_and_grammars_that_cannot_compile_are_400s_with_the_reason(smollm2):
    bad = [
        ({"response_format": _fmt({"type": "object", "properties": {"a": {"$ref": "#/defs/none"}}})}, "response_format"),
        ({"response_format": _fmt({"type": "strin"})}, "response_format"),
        ({"grammar": 'root ::= "a" | undefined_rule'}, "grammar"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": _fmt(), "grammar": 'root ::= "a"'}, "grammar"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectt"}}}],
          "tool_choice": "required"}, "tools"),
    ]
    with trio.fail_after(60):
        async with live_server(smollm2) as (url, _, _):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for extra, param in bad:
                    r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES,
                                                                      "max_tokens": 8, **extra})
                    assert r.status_code == 400, (extra, r.text)
                    err = r.json()["error"]
                    assert err["param"] == param and err["message"], (extra, err)
                ok = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4})
                assert ok.status_code == 200  # nothing stuck behind them


async def test_tool_choice_required_and_named_yield_parseable_calls_and_history_round_trips(smollm2):
    with trio.fail_after(180):
        async with live_server(smollm2, n_ctx=4096) as (url, _, _):
            client = openai_client(url)
            ask = [{"role": "user", "content": "What is the weather in Paris?"}]
            done = await in_thread(client.chat.completions.create, model=MODEL, messages=ask, tools=[WEATHER, ADD],
                                   tool_choice="required", max_tokens=120, temperature=0)
            choice = done.choices[0]
            assert choice.finish_reason == "tool_calls", choice
            calls = choice.message.tool_calls
            assert calls and calls[0].id and calls[0].type == "function"
            assert calls[0].function.name in ("get_weather", "add")
            assert isinstance(json.loads(calls[0].function.arguments), dict)

            named = await in_thread(client.chat.completions.create, model=MODEL, messages=ask, tools=[WEATHER, ADD],
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                    parallel_tool_calls=False, max_tokens=120, temperature=0)
            call = named.choices[0].message.tool_calls[0]
            assert call.function.name == "get_weather" and len(named.choices[0].message.tool_calls) == 1
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, WEATHER["function"]["parameters"])

            def streamed():
                return list(client.chat.completions.create(
                    model=MODEL, messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=120,
                    temperature=0, stream=True))
            chunks = await in_thread(streamed)
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            got = [tc for d in deltas for tc in (d.tool_calls or [])]
            assert got and got[0].function.name == "get_weather" and got[0].function.arguments == ""  # then fragments
            assert json.loads("".join(tc.function.arguments for tc in got if tc.index == 0))
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

            history = ask + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.id, "type": "function",
                     "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "clear"})},
            ]
            after = await in_thread(client.chat.completions.create, model=MODEL, messages=history, tools=[WEATHER],
                                    tool_choice="none", max_tokens=24, temperature=0)
            assert after.choices[0].message.content and not after.choices[0].message.tool_calls


async def test_chat_template_kwargs_reach_the_jinja_template(smollm2):
    """SmolLM2's GGUF template, rendered by Jinja: its default system prompt unless one is given."""
    from skippy.chat_template import render

    text = render(smollm2, [{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    custom = "{{ greeting }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    assert render(smollm2, [{"role": "user", "content": "x"}], template=custom,
                  template_kwargs={"greeting": "hey"}) == "hey[user]x"
    from skippy.chat_template import TemplateError

    with pytest.raises(TemplateError, match="alternate"):
        render(smollm2, [{"role": "user", "content": "x"}],
               template="{{ raise_exception('roles must alternate') }}")


def test_tool_calls_parse_from_each_format_and_unknown_names_stay_content():
    from skippy.server.tools import parse_calls, template_format

    names = ["add"]
    content, calls = parse_calls('Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
                                 '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>', "hermes", names)
    assert content == "Sure." and [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 1}, {"a": 2}]
    assert len({c["id"] for c in calls}) == 2
    assert parse_calls('<|python_tag|>{"name": "add", "parameters": {"a": 1}}', "llama3", names)[1][0]["function"] == \
        {"name": "add", "arguments": '{"a": 1}'}
    assert len(parse_calls('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": {}}]',
                           "mistral", names)[1]) == 2
    assert parse_calls('{"name": "rm", "arguments": {}}', "llama3", names) == ('{"name": "rm", "arguments": {}}', [])
    assert parse_calls("plain answer", "hermes", names) == ("plain answer", [])
    assert template_format("... [TOOL_CALLS] ...") == "mistral" and template_format("<tool_call>") == "hermes"
    assert template_format("<|python_tag|>") == "llama3" and template_format(None) == "hermes"
