"""Goodput at the SLO in simulated time: the engine's own step over a FakeRuntime whose steps cost what a
2-core CPU's do (scaled down), with seeded Poisson arrivals on its fake clock. Scheduler logic only: the
served benchmark (bench/goodput.py) measures the real thing against llama-server."""

from __future__ import annotations

import numpy as np
import pytest

from skippy.testing import FakeRuntime, SyncScheduler

PROMPT, OUT = 32, 16
TTFT_S, TPOT_S = 0.090, 0.006


def run(rate: float, n: int = 160, seed: int = 0, **config) -> dict:
    """`n` requests at Poisson `rate` (req/s, simulated); goodput and what happened to every request."""
    rt = FakeRuntime(n_ctx=4096, n_batch=64, n_seq_max=16, n_vocab=64)
    sim = SyncScheduler(rt, max_waiting=256, prefix_cache=False, **config)
    rng = np.random.default_rng(seed)
    start = rt.clock()
    arrivals = start + np.concatenate(([0.0], np.cumsum(rng.exponential(1 / rate, n - 1))))
    sent: dict[int, float] = {}
    i = 0
    for _ in range(200_000):
        while i < n and arrivals[i] <= rt.clock():
            r = sim.submit([(7 * i + k) % 60 + 1 for k in range(PROMPT)], OUT, ignore_eos=True)
            sent[r.id] = arrivals[i]
            i += 1
        busy = sim.admission.waiting or sim.running or not sim.scheduler.idle
        if not busy:
            if i == n:
                break
            rt.clock.advance(max(0.0, arrivals[i] - rt.clock()))
            continue
        sim.step()
    else:
        raise AssertionError("the simulation did not finish")
    met = failed = 0
    for r in sim.requests:
        times, events = sim.event_times[r.id], sim.events[r.id]
        final = events[-1]
        if final.finish_reason not in ("stop", "length"):
            failed += 1
            continue
        t_first = next(t for t, e in zip(times, events) if e.token is not None)
        tpot = (times[-1] - t_first) / (len(r.generated) - 1)
        met += t_first - sent[r.id] <= TTFT_S and tpot <= TPOT_S
    return {"goodput": met / (rt.clock() - start), "met": met, "failed": failed, "stats": sim.stats()}


@pytest.mark.parametrize("load", [0.8, 1.2, 1.5])
def test_planning_for_the_targets_wins_goodput_where_filling_steps_loses_it(load):
    cap = 60.0  # req/s: the fake's closed-loop capacity on this workload, about (see test_capacity_is_about_60)
    on = run(load * cap, ttft_slo_ms=TTFT_S * 1e3, tpot_slo_ms=TPOT_S * 1e3)
    off = run(load * cap, slo_scheduling=False)
    assert on["failed"] == off["failed"] == 0  # nothing dropped, by default
    assert on["goodput"] >= off["goodput"]
    if load >= 1.2:
        assert on["goodput"] >= 1.5 * off["goodput"], (on["goodput"], off["goodput"])


def test_goodput_does_not_collapse_past_capacity():
    at_1 = run(60.0, ttft_slo_ms=TTFT_S * 1e3, tpot_slo_ms=TPOT_S * 1e3)
    at_15 = run(90.0, ttft_slo_ms=TTFT_S * 1e3, tpot_slo_ms=TPOT_S * 1e3)
    shed = run(90.0, ttft_slo_ms=TTFT_S * 1e3, tpot_slo_ms=TPOT_S * 1e3, shed_late=True)
    assert at_15["goodput"] >= 0.8 * at_1["goodput"], (at_15["goodput"], at_1["goodput"])
    assert shed["goodput"] >= 0.9 * at_1["goodput"], (shed["goodput"], at_1["goodput"])
    assert shed["stats"].slo_shed == shed["failed"] > 0  # the only requests that did not finish were shed


def test_a_backlog_of_late_requests_drains_at_batch_throughput():
    """Everything at once under targets no request can meet: once all are late, nothing is on time to
    protect, and the backlog must drain about as fast as steps planned for throughput alone (before
    late_step_seconds, late prompts went a token or so a step beside the late rows: 1.4x as long)."""
    late = run(1e6, ttft_slo_ms=TTFT_S * 1e3, tpot_slo_ms=0.5 * TPOT_S * 1e3)
    free = run(1e6, slo_scheduling=False)
    assert late["failed"] == 0 and late["stats"].slo_missed >= 150
    assert late["stats"].t_decode <= 1.15 * free["stats"].t_decode, (late["stats"].t_decode,
                                                                     free["stats"].t_decode)


def test_capacity_is_about_60():
    """The rate the loads above are fractions of: everything submitted at once, every simulated second a
    decode's, as a closed loop at full concurrency measures it."""
    burst = run(1e6, slo_scheduling=False)
    rate = 160 / burst["stats"].t_decode
    assert 45 <= rate <= 80, rate
