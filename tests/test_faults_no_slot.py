"""A missing KV slot over a FakeRuntime (scheduling logic; on the real library with patches/0008's hook:
tests/native/test_native_faults_hook.py): once, it is pressure (roll back, preempt, recompute, nobody
fails); when it lasts, the engine fails the requests it cannot place, one per step once nobody is left to
preempt, instead of retrying the same batch forever."""

from __future__ import annotations

import trio

from skippy.errors import NoKvSlotError, StepFailedError
from skippy.testing import FakeRuntime, open_fake_engine


def prompt(i: int, n: int = 10) -> list[int]:
    return [(i * 13 + 5 * k) % 60 + 1 for k in range(n)]


async def consume_all(engine, specs) -> list[list]:
    out: list[list] = [[] for _ in specs]

    async def one(i, p, max_tokens):
        async for event in engine.generate(p, max_tokens=max_tokens):
            out[i].append(event)

    async with trio.open_nursery() as nursery:
        for i, (p, m) in enumerate(specs):
            nursery.start_soon(one, i, p, m)
    return out


def no_slot_from(rt: FakeRuntime, first: int, last: float) -> None:
    """Every decode call from the first-th to the last-th (1-based) finds no slot."""
    calls = 0

    def maybe():
        nonlocal calls
        calls += 1
        if first <= calls <= last:
            rt.fail_next = NoKvSlotError(1, f"no KV slot (injected, call {calls})")

    rt.on_decode = maybe


SPECS = [(prompt(i, 4 + i % 7), 6 + i % 5) for i in range(12)]


async def test_one_missing_slot_is_pressure_nobody_fails():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    no_slot_from(rt, 6, 6)
    with trio.fail_after(20):
        async with open_fake_engine(rt) as engine:
            results = await consume_all(engine, SPECS)
            stats = engine.stats()
    assert [[e.token for e in events if e.token is not None] for events in results] == [
        rt.solo(p, m) for p, m in SPECS]
    assert stats.finished["error"] == 0 and stats.preemptions >= 1
    assert rt.ledger().components[0].used == 0


async def test_a_missing_slot_that_lasts_fails_requests_instead_of_spinning():
    """No slot for any batch from the 6th decode on: requests are preempted until every running one is
    pinned (max_preemptions), then each failing step fails its newest request with a StepFailedError caused
    by the NoKvSlotError; every request ends exactly once, no cell leaks, and once the memory takes batches
    again a new request is served."""
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    no_slot_from(rt, 6, float("inf"))
    with trio.fail_after(20):
        async with open_fake_engine(rt) as engine:
            results = await consume_all(engine, SPECS)
            rt.on_decode = None
            after = [e.token async for e in engine.generate(prompt(99), max_tokens=5) if e.token is not None]
            stats = engine.stats()
    failed = 0
    for (p, m), events in zip(SPECS, results):
        assert sum(e.final for e in events) == 1 and events[-1].final
        tokens = [e.token for e in events if e.token is not None]
        if events[-1].finish_reason == "error":
            failed += 1
            assert isinstance(events[-1].error, StepFailedError)
            assert isinstance(events[-1].error.__cause__, NoKvSlotError)
            assert tokens == rt.solo(p, m)[: len(tokens)]
        else:
            assert tokens == rt.solo(p, m)
    assert failed > 0 and stats.finished["error"] == failed
    assert after == rt.solo(prompt(99), 5)
    assert rt.ledger().components[0].used == 0 and not rt.seqs
