"""logprobs, prompt scoring (echo) and n > 1 forks through the engine's actors, over a FakeRuntime:
scheduling logic only (the same claims on llama.cpp are in tests/native/test_logprobs_native.py)."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from skippy.errors import InvalidInputError, InvalidMaxTokensError
from skippy.kv import ComponentKind
from skippy.scheduling.logprobs import row_logprobs
from skippy.testing import FakeRuntime, open_fake_engine


def prompt(i: int, n: int = 10) -> list[int]:
    return [(i * 13 + 5 * k) % 60 + 1 for k in range(n)]


async def collect(stream) -> list:
    return [event async for event in stream]


def tokens_of(events) -> list[int]:
    return [e.token for e in events if e.token is not None]


def one_hot_logprob(rt: FakeRuntime, token: int, k: int):
    """What the fake's row for `token` (a one-hot row) gives: the reference, computed the same way."""
    row = np.zeros((1, rt.n_vocab), dtype=np.float32)
    row[0, token] = 1.0
    return row_logprobs(row, np.array([0]), [token], [k])[0]


async def test_sampled_tokens_carry_their_logprobs_and_others_carry_none():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    p = prompt(1, 12)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            async with trio.open_nursery() as nursery:
                out = {}

                async def run(name, k):
                    out[name] = await collect(engine.generate(p, max_tokens=8, logprobs=k))

                nursery.start_soon(run, "asked", 3)
                nursery.start_soon(run, "plain", None)
    asked, plain = out["asked"], out["plain"]
    assert tokens_of(asked) == tokens_of(plain) == rt.solo(p, 8)
    assert all(e.logprob is None and e.prompt_logprobs is None for e in plain)
    for e in asked:
        assert e.logprob == one_hot_logprob(rt, e.token, 3)
        assert e.logprob.top[0][0] == e.token and len(e.logprob.top) == 3
    assert asked[0].prompt_logprobs is None


async def test_prompt_scoring_returns_every_prompt_token_once_and_max_tokens_zero_generates_nothing():
    rt = FakeRuntime(n_ctx=512, n_batch=8, n_seq_max=8, prefix=True)  # n_batch 8: the prompt is chunked
    p = prompt(2, 30)
    solo = rt.solo(p, 4)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_block=4, prefix_slots=4) as engine:
            warm = await collect(engine.generate(p, max_tokens=4))  # leaves the prompt in the prefix cache
            assert tokens_of(warm) == solo
            scored = await collect(engine.generate(p, max_tokens=4, prompt_logprobs=1, logprobs=0))
            only = await collect(engine.generate(p, max_tokens=0, prompt_logprobs=0))
            again = await collect(engine.generate(p, max_tokens=4))
    assert tokens_of(scored) == solo
    lps = scored[0].prompt_logprobs
    assert [lp.token for lp in lps] == p[1:]
    # the fake's row at position j holds the next token of the hash chain, not the prompt's: a prompt
    # token's logprob is the reference one-hot row's value for that token
    assert all(len(lp.top) == 1 for lp in lps)
    assert all(e.prompt_logprobs is None for e in scored[1:])
    assert scored[-1].usage.cached_tokens == 0  # scored: its rows were computed, not shared
    assert [(e.token, e.finish_reason) for e in only] == [(None, "length")]
    assert [lp.token for lp in only[0].prompt_logprobs] == p[1:]
    assert [lp.logprob for lp in only[0].prompt_logprobs] == [lp.logprob for lp in lps]
    assert only[0].usage.completion_tokens == 0 and only[0].usage.prompt_tokens == len(p)
    assert again[-1].usage.cached_tokens > 0  # the cache still serves requests that do not score


async def test_max_tokens_zero_needs_prompt_scoring_and_logprobs_are_bounded():
    rt = FakeRuntime()
    async with open_fake_engine(rt) as engine:
        with pytest.raises(InvalidMaxTokensError):
            engine.generate(prompt(0), max_tokens=0)
        with pytest.raises(InvalidInputError):
            engine.generate(prompt(0), max_tokens=2, logprobs=21)
        with pytest.raises(InvalidMaxTokensError):
            engine.generate_choices(prompt(0), n=2, max_tokens=0, prompt_logprobs=0)


@pytest.mark.parametrize("prefix", [True, False])
async def test_forks_share_the_prompt_once_and_each_equals_its_solo(prefix):
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=8, prefix=prefix)
    p = prompt(3, 40)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=2) as engine:
            streams = engine.generate_choices(p, n=4, max_tokens=6)
            results = [None] * 4
            async with trio.open_nursery() as nursery:
                for i, s in enumerate(streams):
                    async def one(i=i, s=s):
                        results[i] = await collect(s)
                    nursery.start_soon(one)
            stats = engine.stats()
            await engine.settled()
    for events in results:
        assert tokens_of(events) == rt.solo(p, 6)
    assert stats.fork_shared_tokens == 3 * (len(p) - 1)
    # the prompt once; each fork computes the prompt's last token itself, in its first (decode-sized) step
    assert stats.prefill_tokens == len(p)
    assert stats.kv_used_peak[ComponentKind.ATTN] <= len(p) + 3 + 4 * 6
    assert [e[-1].usage.cached_tokens for e in results] == [0] + [len(p) - 1] * 3


async def test_cancelling_every_choice_frees_all_of_them():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=8)
    p = prompt(4, 20)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            streams = engine.generate_choices(p, n=3, max_tokens=400)
            for s in streams:
                await s.__anext__()  # each choice is running
            for s in streams:
                s.cancel()
            await engine.settled()
            assert rt.ledger().get(ComponentKind.ATTN).used == 0
            assert engine.stats().running == 0
