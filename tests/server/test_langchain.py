"""LangChain's ChatOpenAI against a live server on SmolLM2: what a framework built on the openai client
sends and reads (invoke, stream, logprobs, bind_tools, with_structured_output). Its sync client runs in
a thread off the trio loop."""

from __future__ import annotations

from typing import Literal

import pytest
import trio
from pydantic import BaseModel, Field

from ._live import in_thread, live_server

pytestmark = pytest.mark.server

MODEL = "test-model"


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=30, description="The city")
    unit: Literal["c", "f"]


class Add(BaseModel):
    """Add two integers."""

    a: int
    b: int


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int
    mood: Literal["happy", "sad"]


def chat_model(url: str, **options):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=f"{url}/v1", api_key="unused", model=MODEL, max_retries=0, timeout=60,
                      **{"temperature": 0, **options})


async def test_invoke_stream_and_logprobs(smollm2):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    messages = [SystemMessage("You are brief."), HumanMessage("Say hello.")]
    with trio.fail_after(120):
        async with live_server(smollm2) as (url, _, _):
            llm = chat_model(url, max_tokens=12)
            msg = await in_thread(llm.invoke, messages)
            assert isinstance(msg, AIMessage) and msg.content
            assert msg.response_metadata["finish_reason"] in ("stop", "length")
            assert msg.usage_metadata["output_tokens"] <= 12 and msg.usage_metadata["input_tokens"] > 10

            chunks = await in_thread(lambda: list(llm.stream(messages)))
            assert "".join(c.content for c in chunks) == msg.content  # greedy: the same text
            assert len([c for c in chunks if c.content]) > 1  # streamed, not sent whole

            scored = chat_model(url, max_tokens=12, logprobs=True, top_logprobs=2)
            msg = await in_thread(scored.invoke, messages)
            entries = msg.response_metadata["logprobs"]["content"]
            assert len(entries) == msg.usage_metadata["output_tokens"]
            assert "".join(e["token"] for e in entries) == msg.content
            for e in entries:
                assert e["logprob"] <= 0 and len(e["top_logprobs"]) >= 1
                assert e["top_logprobs"][0]["logprob"] >= e["logprob"]  # the most likely first


async def test_bind_tools_required_invoke_and_stream_agree(smollm2):
    ask = "What is the weather in Paris, in celsius?"
    with trio.fail_after(180):
        async with live_server(smollm2, n_ctx=4096) as (url, _, _):
            llm = chat_model(url, max_tokens=96, temperature=0.8, seed=3)
            tooled = llm.bind_tools([GetWeather, Add], tool_choice="required", parallel_tool_calls=False)
            msg = await in_thread(tooled.invoke, ask)
            assert msg.tool_calls and not msg.invalid_tool_calls, msg
            call = msg.tool_calls[0]
            assert call["name"] in ("GetWeather", "Add") and call["id"].startswith("call_")
            {"GetWeather": GetWeather, "Add": Add}[call["name"]].model_validate(call["args"])
            assert msg.response_metadata["finish_reason"] == "tool_calls"

            def streamed():
                merged = None
                for chunk in tooled.stream(ask):
                    merged = chunk if merged is None else merged + chunk
                return merged
            merged = await in_thread(streamed)
            assert len(merged.tool_call_chunks) == len(msg.tool_calls)  # one call per index, its fragments joined
            assert [(c["name"], c["args"]) for c in merged.tool_calls] == \
                [(c["name"], c["args"]) for c in msg.tool_calls]  # same seed: the same calls

            named = llm.bind_tools([GetWeather, Add], tool_choice="GetWeather")
            msg = await in_thread(named.invoke, ask)
            assert [c["name"] for c in msg.tool_calls] == ["GetWeather"]
            GetWeather.model_validate(msg.tool_calls[0]["args"])


async def test_with_structured_output_returns_a_valid_model(smollm2):
    ask = "Describe a person."
    with trio.fail_after(120):
        async with live_server(smollm2, n_ctx=4096) as (url, _, _):
            llm = chat_model(url, max_tokens=120)
            person = await in_thread(llm.with_structured_output(Person, method="json_schema").invoke, ask)
            assert isinstance(person, Person)
            raw = await in_thread(llm.with_structured_output(Person, method="json_schema", include_raw=True).invoke,
                                  ask)
            assert raw["parsing_error"] is None and raw["parsed"] == person  # greedy: the same answer
            by_tool = await in_thread(llm.with_structured_output(Person, method="function_calling").invoke, ask)
            assert isinstance(by_tool, Person)  # a forced call to the schema's function
