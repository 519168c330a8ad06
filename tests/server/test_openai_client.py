"""The official openai client against a live server on the default model (SmolLM2)."""

from __future__ import annotations

import pytest
import trio

from ._live import in_thread, live_server, openai_client

pytestmark = pytest.mark.server

MODEL = "test-model"


async def test_completion_and_chat_stream_and_non_stream(smollm2):
    with trio.fail_after(60):
        async with live_server(smollm2) as (url, _, _):
            client = openai_client(url)
            models = await in_thread(client.models.list)
            assert [m.id for m in models.data] == [MODEL]

            full = await in_thread(client.completions.create, model=MODEL, prompt="The capital of France is",
                                   max_tokens=8, temperature=0)
            choice = full.choices[0]
            assert full.object == "text_completion" and choice.text and choice.finish_reason in ("stop", "length")
            assert full.usage.completion_tokens <= 8 and full.usage.prompt_tokens > 0
            assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
            assert full.usage.prompt_tokens_details.cached_tokens == 0

            def stream_completion():
                chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True}))
                return chunks
            chunks = await in_thread(stream_completion)
            assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text  # greedy: same text
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens

            messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello."}]
            chat = await in_thread(client.chat.completions.create, model=MODEL, messages=messages, max_tokens=12,
                                   temperature=0)
            msg = chat.choices[0].message
            assert chat.object == "chat.completion" and msg.role == "assistant" and msg.content
            assert chat.usage.prompt_tokens > 10  # the template's role markers count

            def stream_chat():
                return list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                           stream=True))
            chunks = await in_thread(stream_chat)
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
            assert chunks[-1].choices[0].finish_reason == chat.choices[0].finish_reason


async def test_stop_strings_and_seed_reproducibility(smollm2):
    with trio.fail_after(60):
        async with live_server(smollm2) as (url, _, _):
            client = openai_client(url)
            prompt = "Once upon a time"
            base = (await in_thread(client.completions.create, model=MODEL, prompt=prompt, max_tokens=16,
                                    temperature=0, extra_body={"ignore_eos": True})).choices[0].text
            stop = base[len(base) // 2:][:3]
            assert stop.strip(), base
            cut = await in_thread(client.completions.create, model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                  stop=[stop, "\u2603never"])
            assert cut.choices[0].finish_reason == "stop"
            assert cut.choices[0].text == base[:base.index(stop)]

            def sampled(seed):
                return client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.0,
                                                 top_p=0.95, seed=seed, extra_body={"ignore_eos": True}).choices[0].text
            a, b, c = [await in_thread(sampled, s) for s in (7, 7, 8)]
            assert a == b and a != c


async def test_a_shared_system_prompt_is_reported_as_cached_tokens(smollm2):
    """The second chat over the same system prompt computes only its own part: usage and /metrics say so."""
    import httpx

    from ._live import metric

    system = {"role": "system", "content": "You are a patient tutor for a small school. " * 6}
    with trio.fail_after(60):
        async with live_server(smollm2) as (url, _, _):
            client = openai_client(url)
            usages = []
            for question in ("What is a noun?", "Name a prime number."):
                chat = await in_thread(client.chat.completions.create, model=MODEL, max_tokens=4, temperature=0,
                                       messages=[system, {"role": "user", "content": question}])
                usages.append(chat.usage)
            async with httpx.AsyncClient(base_url=url) as http:
                text = (await http.get("/metrics")).text
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    cached = usages[1].prompt_tokens_details.cached_tokens
    assert 50 < cached < usages[1].prompt_tokens  # the system prompt, not the question
    assert metric(text, "skippy_prefix_cache_hits_tokens_total") == cached
    assert metric(text, "skippy_prefix_cache_queries_tokens_total") == usages[0].prompt_tokens + usages[1].prompt_tokens
