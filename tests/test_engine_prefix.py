"""Prefix reuse through the engine's actors, over a FakeRuntime (scheduling logic only;
what llama.cpp's memory really shares per family is tested in tests/native)."""

from __future__ import annotations

import trio

from skippy.testing import FakeRuntime, open_fake_engine
from skippy.kv import ComponentKind

SYSTEM = [(7 * k) % 50 + 1 for k in range(64)]


def suffix(i: int, n: int = 6) -> list[int]:
    return [(i * 11 + 3 * k) % 50 + 1 for k in range(n)]


async def collect(stream) -> list:
    return [event async for event in stream]


async def until(condition) -> None:
    """Cells are released just after the final event is delivered: wait for it (under fail_after)."""
    while not condition():
        await trio.sleep(0.001)


def tokens_of(events) -> list[int]:
    return [e.token for e in events if e.token is not None]


async def run_all(engine, prompts, max_tokens=8) -> list:
    out = [None] * len(prompts)

    async def one(i):
        out[i] = await collect(engine.generate(prompts[i], max_tokens=max_tokens))

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return out


async def test_requests_arriving_together_compute_a_shared_prefix_once():
    """In-batch dedup: the first computes the system prompt, the others wait for it and share it."""
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=12, prefix=True)
    prompts = [SYSTEM + suffix(i) for i in range(8)]
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=4) as engine:
            results = await run_all(engine, prompts)
            stats = engine.stats()
    for p, events in zip(prompts, results):
        assert tokens_of(events) == rt.solo(p, 8)
    assert [e[-1].usage.cached_tokens for e in results].count(64) == 7
    assert stats.prefix_hits == 7 * 64 and stats.prefix_queries == 8 * 70
    assert stats.prefill_tokens == 8 * 70 - 7 * 64  # the system prompt was computed once
    assert stats.kv_used_peak[ComponentKind.ATTN] <= 64 + 8 * (6 + 8)


async def test_a_later_request_hits_the_resident_copy_after_the_first_is_gone():
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=6, prefix=True)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=2) as engine:
            first = await collect(engine.generate(SYSTEM + suffix(0), max_tokens=4))
            assert first[-1].usage.cached_tokens == 0
            await until(lambda: not [s for s in rt.seqs if s < engine.lanes.ceiling])  # the lane is free...
            assert engine.stats().prefix_entries == 1  # ...and the prompt stayed resident
            second = await collect(engine.generate(SYSTEM + suffix(1), max_tokens=4))
    assert second[-1].usage.cached_tokens == 64
    assert tokens_of(second) == rt.solo(SYSTEM + suffix(1), 4)


async def test_a_recurrent_state_is_restored_only_by_a_prompt_that_extends_its_snapshot():
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=6, recurrent=True, prefix=True)
    turn1 = SYSTEM + suffix(0)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=4) as engine:
            answer = tokens_of(await collect(engine.generate(turn1, max_tokens=4)))
            sibling = await collect(engine.generate(SYSTEM + suffix(1), max_tokens=4))
            turn2 = turn1 + answer + suffix(2)
            follow_up = await collect(engine.generate(turn2, max_tokens=4))
    assert sibling[-1].usage.cached_tokens == 0  # the state after turn1 is not the state after SYSTEM
    assert follow_up[-1].usage.cached_tokens == len(turn1)  # the whole snapshot (the prompt, not the answer)
    assert tokens_of(follow_up) == rt.solo(turn2, 4)


async def test_recurrent_requests_sharing_a_system_prompt_snapshot_it_where_they_part():
    """The second pauses its prefill where its prompt leaves the first one's, a snapshot is kept there,
    and every later request restores it."""
    rt = FakeRuntime(n_ctx=2048, n_batch=32, n_seq_max=8, recurrent=True, prefix=True)
    prompts = [SYSTEM + suffix(i) for i in range(5)]
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=3) as engine:
            results = [await collect(engine.generate(p, max_tokens=4)) for p in prompts]
    for p, events in zip(prompts, results):
        assert tokens_of(events) == rt.solo(p, 4)
    assert [e[-1].usage.cached_tokens for e in results] == [0, 0, 64, 64, 64]


async def test_pressure_evicts_resident_prefixes_before_preempting_anyone():
    rt = FakeRuntime(n_ctx=200, n_batch=32, n_seq_max=6, prefix=True)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=2, prefix_budget_tokens=200, decode_reserve=2) as engine:
            for i in range(2):  # two unrelated prompts stay resident: 2 x 60 of 200 cells
                await collect(engine.generate([(i * 17 + k) % 50 + 1 for k in range(60)], max_tokens=2))
            assert engine.stats().prefix_resident_tokens == 120
            # two requests that grow to 2 x 90 cells: only room if the cache gives its cells back
            results = await run_all(engine, [suffix(i, 30) for i in range(2)], max_tokens=60)
            stats = engine.stats()
    assert all(r[-1].finish_reason == "length" for r in results)
    assert stats.prefix_evictions >= 1 and stats.preemptions == 0


async def test_with_the_cache_off_nothing_is_shared_or_kept():
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=6, prefix=True)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            assert engine.lanes.ceiling == 6  # no ids reserved
            results = await run_all(engine, [SYSTEM + suffix(i) for i in range(3)])
            stats = engine.stats()
    assert stats.prefix_hits == 0 and stats.prefix_entries == 0 and rt.shares == 0
    assert all(r[-1].usage.cached_tokens == 0 for r in results)
    assert rt.ledger().get(ComponentKind.ATTN).used == 0
