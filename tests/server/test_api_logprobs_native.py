"""logprobs, echo and n through the official openai client on the real library (SmolLM2, batch-invariant):
lm-evaluation-harness's loglikelihood request, chat logprobs streamed and not, and n choices."""

from __future__ import annotations

import pytest
import trio

from ._live import in_thread, live_server, openai_client

pytestmark = pytest.mark.server

MODEL = "test-model"


async def test_loglikelihood_as_lm_eval_asks_it(smollm2):
    """echo + logprobs + max_tokens 0 over token ids: every prompt token's logprob, the first null; the
    continuation's sum is the same whether scored alone or with the context before it computed again."""
    with trio.fail_after(120):
        async with live_server(smollm2) as (url, _, engine):
            client = openai_client(url)
            context = engine.tokenize("The capital of France is", True).tolist()
            cont = engine.tokenize(" Paris", False).tolist()
            r = await in_thread(client.completions.create, model=MODEL, prompt=context + cont, max_tokens=0, echo=True,
                                logprobs=1, temperature=0)
            lp = r.choices[0].logprobs
            assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(context) + len(cont)
            assert all(v <= 0 for v in lp.token_logprobs[1:])
            assert r.usage.completion_tokens == 0
            # the same continuation as the greedy generation's first token: its logprob is the generation's
            g = await in_thread(client.completions.create, model=MODEL, prompt=context, max_tokens=1, logprobs=3,
                                temperature=0)
            first = engine.tokenize(g.choices[0].text, False).tolist()
            assert len(first) == 1, first  # one token that re-tokenizes as itself
            again = await in_thread(client.completions.create, model=MODEL, prompt=context + first, max_tokens=0,
                                    echo=True, logprobs=0)
            assert again.choices[0].logprobs.token_logprobs[-1] == g.choices[0].logprobs.token_logprobs[0]
            assert len(g.choices[0].logprobs.top_logprobs[0]) == 3


async def test_chat_logprobs_streamed_equal_whole_and_n_choices(smollm2):
    messages = [{"role": "user", "content": "Name a colour."}]
    with trio.fail_after(120):
        async with live_server(smollm2) as (url, _, _):
            client = openai_client(url)
            whole = await in_thread(client.chat.completions.create, model=MODEL, messages=messages, max_tokens=6,
                                    temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
            content = whole.choices[0].logprobs.content
            assert len(content) == 6 and all(len(c.top_logprobs) == 2 for c in content)
            assert "".join(c.token for c in content) == whole.choices[0].message.content
            assert all(c.top_logprobs[0].logprob == c.logprob for c in content)  # greedy: the most likely

            def streamed():
                return list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                           logprobs=True, top_logprobs=2, stream=True,
                                                           extra_body={"ignore_eos": True}))
            parts = [c for chunk in await in_thread(streamed) for ch in chunk.choices if ch.logprobs
                     for c in ch.logprobs.content]
            assert [(c.token, c.logprob) for c in parts] == [(c.token, c.logprob) for c in content]

            n = await in_thread(client.chat.completions.create, model=MODEL, messages=messages, max_tokens=8, n=3,
                                temperature=0.9, seed=3)
            singles = [(await in_thread(client.chat.completions.create, model=MODEL, messages=messages, max_tokens=8,
                                        temperature=0.9, seed=3 + i)).choices[0].message.content for i in range(3)]
            assert [c.index for c in n.choices] == [0, 1, 2]
            assert [c.message.content for c in n.choices] == singles
