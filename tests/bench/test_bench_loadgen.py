"""Arrival processes on a virtual clock: closed-loop concurrency and Poisson send times."""

from __future__ import annotations

import statistics

import pytest
import trio

from bench.gate.loadgen import closed_loop, open_loop, poisson_offsets
from bench.gate.records import RequestRecord

pytestmark = pytest.mark.bench


def fake_server(service_s: float):
    """A send() whose requests take `service_s` each; tracks how many were in flight at once."""
    state = {"now": 0, "peak": 0, "sent_at": {}}

    async def send(i: int) -> RequestRecord:
        state["sent_at"][i] = trio.current_time()
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await trio.sleep(service_s)
        state["now"] -= 1
        return RequestRecord(index=i, warmup=False, t_send=0.0)

    return send, state


async def test_closed_loop_keeps_n_in_flight(autojump_clock):
    send, state = fake_server(1.0)
    start = trio.current_time()
    with trio.fail_after(100):
        records = await closed_loop(4, 10, send)
    assert [r.index for r in records] == list(range(10))
    assert state["peak"] == 4
    assert trio.current_time() - start == pytest.approx(3.0)  # waves of 4, 4, 2
    assert sorted(state["sent_at"].values())[4] - start == pytest.approx(1.0)  # the 5th waits for a slot


async def test_closed_loop_with_more_workers_than_requests(autojump_clock):
    send, state = fake_server(1.0)
    with trio.fail_after(100):
        assert len(await closed_loop(8, 3, send)) == 3
    assert state["peak"] == 3


def test_poisson_offsets_are_seeded_and_have_the_rate():
    a = poisson_offsets(4.0, 2000, seed=1)
    assert a == poisson_offsets(4.0, 2000, seed=1) and a != poisson_offsets(4.0, 2000, seed=2)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert statistics.mean(y - x for x, y in zip(a, a[1:])) == pytest.approx(0.25, rel=0.1)
    with pytest.raises(ValueError):
        poisson_offsets(0, 3, seed=0)


async def test_open_loop_sends_on_schedule_whatever_the_server_does(autojump_clock):
    send, state = fake_server(10.0)  # far slower than the arrivals: they must not wait
    start = trio.current_time()
    with trio.fail_after(100):
        records = await open_loop([0.0, 0.5, 2.0], send)
    assert [r.index for r in records] == [0, 1, 2]
    assert [state["sent_at"][i] - start for i in range(3)] == pytest.approx([0.0, 0.5, 2.0])
    assert state["peak"] == 3
