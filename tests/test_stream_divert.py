"""GenerationStream.divert: events taken in the step that made them while the reader waits, the rest
read as before; every event once, in order. The real engine over a FakeRuntime (scheduler plumbing,
no llama claim)."""

from __future__ import annotations

import re

import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from skippy.testing import FakeRuntime, open_fake_engine

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def fake() -> FakeRuntime:
    return FakeRuntime(n_ctx=512, n_batch=32, n_seq_max=4, n_vocab=64)


async def _run(take_rule, n: int, read_pause: float = 0.0):
    """(log of ("take"|"read", event) in the order they happened, the runtime). With `read_pause`, the
    reader sleeps that long after its first read once diverted (the engine runs ahead meanwhile)."""
    rt = fake()
    log: list[tuple[str, object]] = []
    async with open_fake_engine(rt, prefix_cache=False) as engine:
        stream = engine.generate(PROMPT, max_tokens=n, ignore_eos=True)
        await stream.queued()
        calls = 0

        def take(event):
            nonlocal calls
            calls += 1
            if take_rule(calls):
                log.append(("take", event))
                return True
            return False

        first = await stream.batch()  # as the server does: divert once the response has started
        log += [("read", e) for e in first]
        stream.divert(take)
        while True:
            events = await stream.batch()
            if not events:
                break
            log += [("read", e) for e in events]
            if read_pause:
                await trio.sleep(read_pause)
                read_pause = 0.0
    return log, rt


async def test_a_waiting_reader_is_not_woken_for_taken_events_and_gets_the_last_one():
    with trio.fail_after(10):
        log, rt = await _run(lambda call: True, 30)
    events = [e for _, e in log]
    assert [e.token for e in events if e.token is not None] == rt.solo(PROMPT, 30)  # each once, in order
    assert sum(e.final for e in events) == 1 and log[-1][0] == "read" and log[-1][1].final
    taken = [w for w, _ in log].count("take")
    assert taken >= 25  # the reader waited between steps: almost every token was taken inline


async def test_a_refused_event_and_those_behind_it_queue_for_the_reader_in_order():
    with trio.fail_after(10):
        log, rt = await _run(lambda call: call % 3 != 0, 40)  # every third offer refused
    events = [e for _, e in log]
    assert [e.token for e in events if e.token is not None] == rt.solo(PROMPT, 40)
    assert {w for w, _ in log} == {"take", "read"}


async def test_a_slow_reader_catches_up_then_takes_inline_again():
    with trio.fail_after(10):
        # the third offer refused; the pause is long enough for tokens to queue behind it on a busy box,
        # and the stream long enough to go on after it on a fast one
        log, rt = await _run(lambda call: call != 3, 480, read_pause=0.02)
    events = [e for _, e in log]
    assert [e.token for e in events if e.token is not None] == rt.solo(PROMPT, 480)
    ways = "".join("T" if w == "take" else "R" for w, _ in log)
    diverted = ways[ways.index("T"):]
    # two taken, the refused one and those that queued behind it while the reader slept read in one
    # go, then taken inline again once the reader waits with nothing queued
    assert re.match(r"TTRR+T", diverted), diverted


async def test_a_taker_that_raises_is_logged_and_every_later_event_is_read():
    from loguru import logger

    messages: list[str] = []
    logger.enable("skippy")  # the library is silent until its user enables it
    sink = logger.add(lambda m: messages.append(str(m)), level="ERROR")
    try:
        def rule(call):
            if call == 4:
                raise RuntimeError("boom")
            return True

        with trio.fail_after(10):
            log, rt = await _run(rule, 20)
    finally:
        logger.remove(sink)
        logger.disable("skippy")
    events = [e for _, e in log]
    assert [e.token for e in events if e.token is not None] == rt.solo(PROMPT, 20)
    ways = [w for w, _ in log]
    assert ways.count("take") == 3 and all(w == "read" for w in ways[ways.index("take") + 3:])
    assert any("inline event reader failed" in m for m in messages)


async def test_divert_twice_or_after_the_end_is_refused():
    with trio.fail_after(10):
        async with open_fake_engine(fake(), prefix_cache=False) as engine:
            stream = engine.generate(PROMPT, max_tokens=2, ignore_eos=True)
            stream.divert(lambda e: False)
            with pytest.raises(RuntimeError):
                stream.divert(lambda e: False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(refusals=st.lists(st.booleans(), min_size=1, max_size=12), n=st.integers(1, 40),
       pause=st.sampled_from([0.0, 0.002]))
def test_any_pattern_of_refusals_delivers_every_event_once_in_order(refusals, n, pause):
    async def main():
        with trio.fail_after(20):
            return await _run(lambda call: refusals[call % len(refusals)], n, read_pause=pause)

    log, rt = trio.run(main)
    events = [e for _, e in log]
    assert [e.token for e in events if e.token is not None] == rt.solo(PROMPT, n)
    assert [e.final for e in events] == [False] * (len(events) - 1) + [True]
    assert log[-1][0] == "read"
