"""vLLM's metric definitions, checked against values computed by hand."""

from __future__ import annotations

import pytest

from bench.gate.metrics import Slo, cells_per_session, counter_delta_ratio, meets_slo, percentile, summarize, tpot
from bench.gate.records import RequestRecord

pytestmark = pytest.mark.bench


def rec(ttft=0.1, e2e=1.0, n=10, itl=None, prompt=100, cached=None, error=None, warmup=False, index=0):
    return RequestRecord(index=index, warmup=warmup, t_send=0.0, ttft=ttft, e2e=e2e, itl=itl or [], prompt_tokens=prompt,
                         output_tokens=n, cached_tokens=cached, error=error)


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([1, 2, 3, 4], 50, 2.5),  # rank 1.5: halfway between 2 and 3
    ([1, 2, 3, 4], 99, 3.97),  # rank 2.97: 3 + 0.97 x (4 - 3)
    ([4, 1, 3, 2], 0, 1),  # order does not matter
    ([1, 2, 3, 4], 100, 4),
    ([0, 10], 25, 2.5),
    ([7], 99, 7),
])
def test_percentile_interpolates_linearly(values, p, expected):
    assert percentile(values, p) == pytest.approx(expected)


def test_percentile_of_nothing_is_none_and_range_is_checked():
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_tpot_excludes_the_first_token():
    assert tpot(rec(ttft=0.1, e2e=1.0, n=10)) == pytest.approx(0.1)  # 0.9 s over 9 tokens after the first
    assert tpot(rec(n=1)) is None  # no token after the first
    assert tpot(rec(ttft=None)) is None


def test_slo_needs_every_target_met():
    slo = Slo(ttft_ms=200, tpot_ms=150)
    assert meets_slo(rec(ttft=0.1, e2e=1.0, n=10), slo)  # 100 ms, 100 ms
    assert not meets_slo(rec(ttft=0.3, e2e=1.2, n=10), slo)  # TTFT 300 ms
    assert not meets_slo(rec(ttft=0.1, e2e=2.0, n=10), slo)  # TPOT 211 ms
    assert not meets_slo(rec(error="HTTP 429"), slo)
    assert meets_slo(rec(ttft=0.1, e2e=5.0, n=1), slo)  # one token: no TPOT to miss
    assert not meets_slo(rec(ttft=0.1, e2e=1.0, n=10), Slo(e2e_ms=999))


def test_summary_by_hand():
    records = [
        rec(ttft=0.1, e2e=1.0, n=10, itl=[0.1] * 9, prompt=100, cached=50),  # TPOT 100 ms: within SLO
        rec(ttft=0.3, e2e=2.1, n=10, itl=[0.2] * 9, prompt=100, cached=0),  # TPOT 200 ms, TTFT 300 ms: not
        rec(error="stream error: shutting down", n=0),
    ]
    s = summarize(records, duration=4.0, slo=Slo(ttft_ms=200, tpot_ms=150))
    assert (s.completed, s.failed) == (2, 1)
    assert s.req_per_s == pytest.approx(0.5)
    assert s.out_tok_per_s == pytest.approx(5.0)  # 20 tokens / 4 s
    assert s.in_tok_per_s == pytest.approx(50.0)
    assert s.goodput == pytest.approx(0.25)  # one request in 4 s
    assert s.ttft_p50_ms == pytest.approx(200)
    assert s.ttft_p99_ms == pytest.approx(298)  # 100 + 0.99 x 200
    assert s.ttft_mean_ms == pytest.approx(200)
    assert s.tpot_p50_ms == pytest.approx(150)
    assert s.tpot_p99_ms == pytest.approx(199)
    assert s.itl_p50_ms == pytest.approx(150)  # 18 gaps: rank 8.5 between 100 and 200
    assert s.itl_p99_ms == pytest.approx(200)
    assert s.e2e_p50_ms == pytest.approx(1550)
    assert s.cached_token_ratio == pytest.approx(0.25)  # 50 of 200 prompt tokens


def test_summary_without_slo_has_no_goodput_and_empty_runs_are_zero():
    assert summarize([rec()], 1.0).goodput is None
    s = summarize([], 0.0, Slo(ttft_ms=1))
    assert (s.completed, s.out_tok_per_s, s.goodput, s.ttft_p99_ms, s.cached_token_ratio) == (0, 0.0, 0.0, None, None)


def test_prefix_hit_rate_is_a_counter_delta():
    assert counter_delta_ratio(10, 40, 100, 160) == pytest.approx(0.5)  # 30 hits of 60 queried tokens
    assert counter_delta_ratio(0, 0, 0, 0) is None  # nothing queried: undefined, not 0
    assert counter_delta_ratio(None, 5, 0, 10) is None  # counter missing


def test_cells_per_session_skips_idle_samples():
    got = cells_per_session([(300, 3), (0, 0), (400, 2)])
    assert got == {"mean": pytest.approx(150), "max": 200, "samples": 2}
    assert cells_per_session([(5, 0)]) == {"mean": None, "max": None, "samples": 0}
