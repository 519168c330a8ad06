"""logprobs, prompt scoring (echo) and n > 1 forks on the real library (a synthetic llama, batch-invariant):
the same bytes alone or under load, prompt rows that are the generation's rows, a prefix-cache hit that
does not skip the rows scoring needs, and forks that compute the prompt once and equal their solo runs."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import skippy
from skippy.kv import ComponentKind
from skippy.native import Model

pytestmark = pytest.mark.native

ATTN = ComponentKind.ATTN


@pytest.fixture(scope="module")
def llama(synth_model_path):
    with Model(synth_model_path("llama"), repack=False) as m:
        yield m


def prompt(i: int, n: int = 40) -> list[int]:
    return [300 + (i * 7 + 3 * k) % 200 for k in range(n)]


def opts(**kw):
    return {**dict(n_ctx=2048, n_batch=64, threads=1), **kw}


async def collect(stream) -> list:
    return [e async for e in stream]


async def test_logprobs_alone_equal_logprobs_with_three_others_in_the_batch(llama):
    p = prompt(1, 70)  # longer than n_batch: chunked, alone and under load differently

    async def run(load: bool):
        async with skippy.open_engine(llama, **opts(prefix_cache=False)) as engine:
            mine: list = []

            async def target():
                mine.extend(await collect(engine.generate(p, max_tokens=12, logprobs=5, prompt_logprobs=3,
                                                          ignore_eos=True)))

            async def other(i):
                await collect(engine.generate(prompt(10 + i, 30 + 9 * i), {"temperature": 0.8, "seed": i},
                                              max_tokens=20, ignore_eos=True, logprobs=2 if i == 0 else None))

            async with trio.open_nursery() as nursery:
                if load:
                    for i in range(3):
                        nursery.start_soon(other, i)
                nursery.start_soon(target)
            return mine

    with trio.fail_after(120):
        alone, loaded = await run(False), await run(True)
    assert [e.token for e in alone] == [e.token for e in loaded]
    assert [e.logprob for e in alone] == [e.logprob for e in loaded]  # floats: the same bytes
    assert alone[0].prompt_logprobs == loaded[0].prompt_logprobs
    assert len(alone[0].prompt_logprobs) == len(p) - 1
    assert all(e.logprob.top[0][0] == e.token for e in alone)  # greedy: the sampled token is the most likely
    assert all(len(e.logprob.top) == 5 for e in alone)


async def test_scoring_a_prompt_plus_its_completion_gives_the_generations_logprobs(llama):
    """The prompt rows of echo are the rows generation samples from: score(p + g)[len(p) - 1:] == g's logprobs."""
    p = prompt(2, 50)
    with trio.fail_after(120):
        async with skippy.open_engine(llama, **opts()) as engine:
            gen = await collect(engine.generate(p, max_tokens=8, logprobs=2, ignore_eos=True))
            g = [e.token for e in gen]
            scored = await collect(engine.generate(p + g, max_tokens=0, prompt_logprobs=2))
    assert [(e.token, e.finish_reason) for e in scored] == [(None, "length")]
    rows = scored[0].prompt_logprobs
    assert len(rows) == len(p) + len(g) - 1
    assert list(rows[len(p) - 1:]) == [e.logprob for e in gen]


async def test_a_prefix_cache_hit_does_not_skip_the_rows_scoring_needs(llama):
    p = prompt(3, 96)
    with trio.fail_after(120):
        async with skippy.open_engine(llama, **opts(prefix_cache=False)) as engine:
            cold = (await collect(engine.generate(p, max_tokens=0, prompt_logprobs=1)))[0]
        async with skippy.open_engine(llama, **opts()) as engine:
            warm = await collect(engine.generate(p, max_tokens=4, ignore_eos=True))  # its prompt stays resident
            hit = await collect(engine.generate(p, max_tokens=4, ignore_eos=True))
            scored = await collect(engine.generate(p, max_tokens=1, prompt_logprobs=1, ignore_eos=True))
            stats = engine.stats()
    assert hit[-1].usage.cached_tokens > 0 and stats.prefix_hits > 0  # the cache held the prompt
    assert scored[-1].usage.cached_tokens == 0  # scoring computed every row
    assert scored[0].prompt_logprobs == cold.prompt_logprobs
    assert len(cold.prompt_logprobs) == len(p) - 1
    assert [e.token for e in scored] == [e.token for e in warm][:1]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 7}], ids=["greedy", "seeded"])
async def test_each_fork_equals_the_same_request_with_n1_and_its_seed(llama, sampling):
    p = prompt(4, 60)
    with trio.fail_after(120):
        async with skippy.open_engine(llama, **opts()) as engine:
            streams = engine.generate_choices(p, sampling, n=4, max_tokens=10, ignore_eos=True)
            got: list = [None] * 4
            async with trio.open_nursery() as nursery:
                for i, s in enumerate(streams):
                    async def one(i=i, s=s):
                        got[i] = [e.token for e in await collect(s)]
                    nursery.start_soon(one)
            shared = engine.stats().fork_shared_tokens
        async with skippy.open_engine(llama, **opts(prefix_cache=False)) as engine:
            solo = []
            for i in range(4):
                params = {**sampling, "seed": sampling["seed"] + i} if sampling else {}
                solo.append([e.token for e in await collect(engine.generate(p, params, max_tokens=10, ignore_eos=True))])
    assert got == solo
    assert shared == 3 * (len(p) - 1)
    if sampling:
        assert len({tuple(t) for t in got}) > 1


async def test_four_forks_of_a_1024_token_prompt_compute_and_hold_it_once(llama):
    p = [260 + (11 * k) % 250 for k in range(1024)]
    with trio.fail_after(240):
        async with skippy.open_engine(llama, **opts(n_ctx=4096, n_batch=256)) as engine:
            streams = engine.generate_choices(p, {"temperature": 0.7, "seed": 1}, n=4, max_tokens=8, ignore_eos=True)
            async with trio.open_nursery() as nursery:
                for s in streams:
                    nursery.start_soon(collect, s)
            stats = engine.stats()
            await engine.settled()
            ctx = engine.runtime.ctx
            assert [s for s in range(engine.lanes.ceiling) if ctx.seq_pos_max(s) != -1] == []  # every lane freed
    assert stats.prefill_tokens == 1024  # the prompt computed once (each fork's last token is a decode row)
    assert stats.fork_shared_tokens == 3 * 1023
    # cells held at the peak: the prompt once, one cell per fork for its last prompt token, the outputs
    assert stats.kv_used_peak[ATTN] <= 1024 + 3 + 4 * 8, stats.kv_used_peak
