"""Rounds of one load (bench/gate/rounds.py): alternating engine order and the pooled run."""

from __future__ import annotations

import pytest

from bench.gate.metrics import Slo, run_summary
from bench.gate.records import Load, RequestRecord, RunResult
from bench.gate.rounds import merge_rounds, round_order


def _run(duration: float, ttfts: list[float], engine: str = "skippy", rss: float = 100.0) -> RunResult:
    warm = [RequestRecord(0, True, 0.0, 0.1, 0.2, [], 8, 4)]
    measured = [RequestRecord(i, False, 0.5 * i, t, t + 1.0, [0.1] * 3, 8, 4) for i, t in enumerate(ttfts)]
    return RunResult(engine, "chat", Load.closed(1), duration, warm + measured, {"peak_rss_mb": rss, "pid": 1})


def test_engines_alternate_order_round_by_round():
    engines = ["skippy", "skippy-fast", "llama-server"]
    assert [round_order(engines, k) for k in range(3)] == [engines, engines[::-1], engines]


def test_pooled_run_keeps_every_request_once_and_adds_the_time():
    a, b = _run(10.0, [0.1, 0.2]), _run(30.0, [0.3, 0.4], rss=150.0)
    merged = merge_rounds([a, b])
    measured = merged.measured()
    assert [r.ttft for r in measured] == [0.1, 0.2, 0.3, 0.4]
    assert len({r.index for r in measured}) == 4
    assert [r.t_send for r in measured] == [0.0, 0.5, 10.0, 10.5]  # round 2 starts after round 1's time
    assert merged.duration == 40.0 and merged.server["peak_rss_mb"] == 150.0
    assert [r["duration"] for r in merged.server["rounds"]] == [10.0, 30.0]
    # throughput over the pool: all output over all time (4 x 4 tokens / 40 s), not the mean of the rounds' rates
    assert run_summary(merged, Slo()).out_tok_per_s == pytest.approx(16 / 40.0)


def test_one_round_is_the_run_itself_and_different_runs_do_not_merge():
    a = _run(10.0, [0.1])
    assert merge_rounds([a]) is a
    with pytest.raises(ValueError):
        merge_rounds([a, _run(10.0, [0.1], engine="llama-server")])
    with pytest.raises(ValueError):
        merge_rounds([])
