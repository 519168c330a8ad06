"""The engine's actors through trio, over a FakeRuntime: scheduling logic only (llama.cpp behaviour is tested natively)."""

from __future__ import annotations

import threading

import pytest
import trio

import skippy
from skippy.errors import (
    DecodeError,
    EmptyPromptError,
    InvalidInputError,
    InvalidMaxTokensError,
    OverloadedError,
    PromptTooLongError,
    StepFailedError,
)
from skippy.testing import FakeRuntime, open_fake_engine
from skippy.sampling import SamplingParams


def prompt(i: int, n: int = 10) -> list[int]:
    return [(i * 13 + 5 * k) % 60 + 1 for k in range(n)]


async def collect(stream) -> list:
    return [event async for event in stream]


def tokens_of(events) -> list[int]:
    return [e.token for e in events if e.token is not None]


async def run_all(engine, specs) -> list:
    out = [None] * len(specs)

    async def one(i, p, kw):
        out[i] = await collect(engine.generate(p, **kw))

    async with trio.open_nursery() as nursery:
        for i, (p, kw) in enumerate(specs):
            nursery.start_soon(one, i, p, kw)
    return out


async def test_concurrent_outputs_equal_solo_and_free_everything():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            specs = [(prompt(i, 5 + 3 * i), {"max_tokens": 12}) for i in range(10)]
            results = await run_all(engine, specs)
            for (p, kw), events in zip(specs, results):
                assert tokens_of(events) == rt.solo(p, 12)
                assert [e.index for e in events] == list(range(12))
                last = events[-1]
                assert last.finish_reason == "length" and not any(e.final for e in events[:-1])
                assert last.usage == skippy.Usage(prompt_tokens=len(p), completion_tokens=12, cached_tokens=0)
            stats = engine.stats()
            assert stats.max_running == 4 and stats.finished["length"] == 10
            assert stats.mixed_steps > 0
    assert rt.ledger().get(skippy.kv.ComponentKind.ATTN).used == 0
    assert rt.closed


async def test_text_events_and_stop_strings():
    rt = FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=2)
    p = prompt(3)
    solo_text = "".join(rt.piece(t).decode() for t in rt.solo(p, 20))
    stop = solo_text[6:8]
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            plain = await collect(engine.generate(p, max_tokens=20))
            assert "".join(e.text for e in plain) == solo_text
            stopped = await collect(engine.generate(p, max_tokens=20, stop=["zzz", stop]))
    text = "".join(e.text for e in stopped)
    assert text == solo_text[: solo_text.index(stop)]
    assert stopped[-1].finish_reason == "stop"


async def test_end_of_generation_token_stops():
    rt = FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=2, eog_every=5)
    p = next(p for p in (prompt(i) for i in range(100)) if len(rt.solo(p, 30)) < 30)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            events = await collect(engine.generate(p, max_tokens=30))
    assert tokens_of(events) == rt.solo(p, 30) and events[-1].token == 0
    assert events[-1].finish_reason == "stop"


async def test_settled_waits_for_the_release_of_a_request_a_chained_step_still_held():
    """With overlapped steps a stream that ends on end-of-generation has its final event before its
    lane is given back; settled() returns once nothing is queued, running or held."""
    rt = FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=2, eog_every=5)
    p = next(p for p in (prompt(i) for i in range(100)) if 5 < len(rt.solo(p, 30)) < 30)
    gate = threading.Event()
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            await engine.settled()  # an engine with nothing to do is settled
            stream = engine.generate(p, max_tokens=30)
            rt.on_decode = gate.wait  # the engine cannot finish anything until the gate opens
            with trio.move_on_after(0.05) as waited:
                await engine.settled()  # submitted: not settled, even before the composer woke to see it
            assert waited.cancelled_caught
            gate.set()
            events = await collect(stream)
            await engine.settled()
            assert engine.stats().running == 0
            assert rt.ledger().get(skippy.kv.ComponentKind.ATTN).used == 0
    assert events[-1].finish_reason == "stop"


async def test_validation_errors_are_named():
    rt = FakeRuntime(n_ctx=64, n_batch=16, n_seq_max=2)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            with pytest.raises(EmptyPromptError):
                engine.generate([], max_tokens=4)
            with pytest.raises(EmptyPromptError):
                engine.generate("", max_tokens=4)
            for bad in (0, -1, 1.5, True):
                with pytest.raises(InvalidMaxTokensError):
                    engine.generate([1, 2], max_tokens=bad)
            with pytest.raises(PromptTooLongError):
                engine.generate(prompt(1, 60), max_tokens=5)
            with pytest.raises(InvalidInputError):
                engine.generate([1, 2], {"temperature": -1.0})
            with pytest.raises(InvalidInputError):
                engine.generate([1, 2], {"top_p": 0.0})
            with pytest.raises(InvalidInputError):
                engine.generate([1, 999], max_tokens=2)
            assert engine.stats().submitted == 0
            assert tokens_of(await collect(engine.generate([1, 2], max_tokens=3))) == rt.solo([1, 2], 3)


async def test_overload_fails_fast_with_named_errors_none_lost_none_hang():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=1)
    outcomes: dict[int, object] = {}
    with trio.fail_after(10):
        async with open_fake_engine(rt, max_waiting=3) as engine:
            streams = [engine.generate(prompt(i), max_tokens=4) for i in range(8)]

            async def consume(i, s):
                try:
                    outcomes[i] = tokens_of(await collect(s))
                except OverloadedError as exc:
                    outcomes[i] = exc

            async with trio.open_nursery() as nursery:
                for i, s in enumerate(streams):
                    nursery.start_soon(consume, i, s)
            assert engine.stats().rejected == 5
    rejected = [i for i, o in outcomes.items() if isinstance(o, OverloadedError)]
    assert len(outcomes) == 8 and sorted(rejected) == [3, 4, 5, 6, 7]  # the first three queued, FCFS
    for i in (0, 1, 2):
        assert outcomes[i] == rt.solo(prompt(i), 4)


async def test_cancelling_a_consumer_frees_its_cells_within_a_step_and_leaves_others_unchanged():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    reports = []
    cells_after = {}  # step -> cells per seq, seen at the end of that step
    cancelled_at = {}

    def on_step(report):
        reports.append(report)
        cells_after[report.step] = {s: len(c) for s, c in rt.seqs.items()}
        victim_request = cancelled_at.get("request")
        if victim_request is not None and victim_request.cancel_requested and "step" not in cancelled_at:
            cancelled_at["step"] = report.step - 1  # the engine learnt of it during this step

    with trio.fail_after(10):
        async with open_fake_engine(rt, on_step=on_step) as engine:
            results = {}

            async def victim():
                stream = engine.generate(prompt(1), max_tokens=40)
                with trio.CancelScope() as scope:
                    async for event in stream:
                        if event.index == 5:
                            # the cancel reaches the engine at this task's next checkpoint: with the
                            # fake's microsecond decodes that can be a few steps on, so k is taken
                            # from when the engine saw it (on_step), not from here
                            cancelled_at["request"] = stream.request
                            cancelled_at["seq"] = stream.request.seq_id
                            scope.cancel()
                results["victim"] = stream.request

            async def other(i):
                results[i] = tokens_of(await collect(engine.generate(prompt(i), max_tokens=20)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(victim)
                for i in (2, 3, 4):
                    nursery.start_soon(other, i)
            assert engine.stats().finished["cancelled"] == 1
    for i in (2, 3, 4):
        assert results[i] == rt.solo(prompt(i), 20)
    k, seq = cancelled_at["step"], cancelled_at["seq"]
    # when the consumer cancels, the step after k may be computing and (overlapped decoding) the one
    # after it launched already; the step after those starts without the victim and frees its cells
    assert cells_after[k + 3].get(seq, 0) == 0
    assert results["victim"].finish_reason == "cancelled"
    assert all(results["victim"].id not in r.decode_ids for r in reports if r.step >= k + 3)


async def test_cancelling_a_waiting_request_removes_it():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=1)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            first = engine.generate(prompt(1), max_tokens=30)
            second = engine.generate(prompt(2), max_tokens=30)
            event = await first.__anext__()  # first is running, second waits for the only lane
            assert event.index == 0
            assert engine.stats().waiting == 1
            second.cancel()
            rest = await collect(first)
            assert len(rest) == 29
            stats = engine.stats()
            assert stats.admitted == 1 and stats.finished["cancelled"] == 1 and stats.waiting == 0
            with pytest.raises(StopAsyncIteration):
                await second.__anext__()


async def test_a_failing_step_fails_only_its_requests_and_the_engine_keeps_serving():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=2)

    def fail_third():
        if rt.decodes == 2:
            rt.fail_next = DecodeError(-3, "injected kernel failure")
            rt.on_decode = None

    rt.on_decode = fail_third
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            a, b, c = (engine.generate(prompt(i), max_tokens=6) for i in range(3))
            results = await run_all_streams([a, b, c])
            for events in results[:2]:
                assert events[-1].finish_reason == "error"
                assert isinstance(events[-1].error, StepFailedError)
                assert "injected kernel failure" in str(events[-1].error)
            assert tokens_of(results[2]) == rt.solo(prompt(2), 6)
            assert tokens_of(await collect(engine.generate(prompt(5), max_tokens=6))) == rt.solo(prompt(5), 6)
            assert engine.stats().finished["error"] == 2
    assert rt.ledger().components[0].used == 0


async def run_all_streams(streams) -> list:
    out = [None] * len(streams)

    async def one(i, s):
        out[i] = await collect(s)

    async with trio.open_nursery() as nursery:
        for i, s in enumerate(streams):
            nursery.start_soon(one, i, s)
    return out


async def test_other_tasks_progress_while_a_step_computes():
    rt = FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=2)
    entered, release = threading.Event(), threading.Event()

    def block():
        entered.set()
        assert release.wait(10)

    rt.on_decode = block
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            stream = engine.generate(prompt(1), max_tokens=3)
            async with trio.open_nursery() as nursery:
                got = []

                async def consume():
                    got.extend(await collect(stream))

                nursery.start_soon(consume)
                while not entered.is_set():
                    await trio.sleep(0.001)
                ticks = 0
                for _ in range(200):  # the event loop is free while the decode is blocked in its thread
                    await trio.sleep(0)
                    ticks += 1
                assert ticks == 200 and rt.decodes == 0 and not got
                rt.on_decode = None
                release.set()
            assert tokens_of(got) == rt.solo(prompt(1), 3)


async def test_shutdown_leaves_no_task_or_thread_and_ends_open_streams():
    rt = FakeRuntime(n_ctx=256, n_batch=16, n_seq_max=1)
    before = {t.ident for t in threading.enumerate()}
    events = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with open_fake_engine(rt) as engine:
                running = engine.generate(prompt(1), max_tokens=200)
                waiting = engine.generate(prompt(2), max_tokens=200)

                async def consume(s):
                    events.append(await collect(s))

                nursery.start_soon(consume, running)
                nursery.start_soon(consume, waiting)
                while engine.stats().steps < 3:
                    await trio.sleep(0.001)
                worker = engine.worker
            # the engine is closed; both consumers end with a cancelled event instead of hanging
    assert sorted(e[-1].finish_reason for e in events) == ["cancelled", "cancelled"]
    assert not worker.alive
    assert {t.ident for t in threading.enumerate()} <= before
    assert rt.closed
    with pytest.raises(skippy.EngineClosedError):
        engine.generate([1], max_tokens=1)


async def test_preemption_by_recompute_neither_drops_nor_duplicates_tokens():
    rt = FakeRuntime(n_ctx=64, n_batch=16, n_seq_max=4)
    with trio.fail_after(10):
        async with open_fake_engine(rt, decode_reserve=2, max_preemptions=3) as engine:
            specs = [(prompt(i, 10), {"max_tokens": 30}) for i in range(4)]
            results = await run_all(engine, specs)
            stats = engine.stats()
    assert stats.preemptions > 0
    for (p, _), events in zip(specs, results):
        assert tokens_of(events) == rt.solo(p, 30)
        assert [e.index for e in events] == list(range(30))


@pytest.mark.parametrize("victims", ["newest", "fewest_outputs"])
async def test_repeated_preemption_of_one_request_is_bounded(victims):
    """A low-priority request under a stream of high-priority ones is preempted at most max_preemptions times."""
    rt = FakeRuntime(n_ctx=80, n_batch=16, n_seq_max=4)
    with trio.fail_after(20):
        async with open_fake_engine(rt, decode_reserve=2, max_preemptions=2, victim_policy=victims) as engine:
            low = engine.generate(prompt(0, 10), max_tokens=60, priority=1)  # higher value, lower priority
            results = {}

            async def consume(name, s):
                results[name] = await collect(s)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume, "low", low)
                for wave in range(6):
                    while engine.stats().steps < 8 * wave:
                        await trio.sleep(0.001)
                    for j in range(2):
                        s = engine.generate(prompt(10 + 2 * wave + j, 10), max_tokens=25, priority=0)
                        nursery.start_soon(consume, (wave, j), s)
            assert engine.stats().preemptions >= 2
    assert low.request.preemptions == 2 and low.request.pinned
    assert tokens_of(results["low"]) == rt.solo(prompt(0, 10), 60)
    for (name, events) in results.items():
        if name != "low":
            wave, j = name
            assert tokens_of(events) == rt.solo(prompt(10 + 2 * wave + j, 10), 25)


async def test_a_seed_gives_the_same_tokens_whatever_else_is_in_the_batch():
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.01, seed=1234)
    p = prompt(7)

    async def alone():
        rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
        async with open_fake_engine(rt) as engine:
            return tokens_of(await collect(engine.generate(p, params, max_tokens=20)))

    async def crowded():
        rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
        async with open_fake_engine(rt) as engine:
            specs = [(prompt(i), {"max_tokens": 15, "sampling": SamplingParams(temperature=0.7, seed=i)}) for i in range(3)]
            specs.insert(1, (p, {"max_tokens": 20, "sampling": params}))
            return tokens_of((await run_all(engine, specs))[1])

    with trio.fail_after(10):
        solo, busy = await alone(), await crowded()
    assert solo == busy
    assert solo != FakeRuntime().solo(p, 20)  # it really sampled
