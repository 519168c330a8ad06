"""Pure metric definitions, the same as vLLM's `bench serve`, so our figures compare with theirs.

TTFT = first text chunk - send; E2E = last chunk - send; TPOT = (E2E - TTFT) / (output
tokens - 1) per request; ITL = every gap between text chunks, pooled over requests;
percentiles interpolate linearly between order statistics (numpy's default); throughput and
goodput divide by the measured phase's wall time; goodput counts only successful requests
that meet every SLO given. No I/O here: unit-tested with hand-computed values.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import attrs

from .records import RequestRecord, RunResult


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside [0, 100]")
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def tpot(r: RequestRecord) -> float | None:
    """Time per output token after the first; undefined for fewer than two tokens."""
    if r.ttft is None or r.e2e is None or r.output_tokens < 2:
        return None
    return (r.e2e - r.ttft) / (r.output_tokens - 1)


@attrs.frozen
class Slo:
    """Latency targets in milliseconds; None means that target is not part of the SLO."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None


def meets_slo(r: RequestRecord, slo: Slo) -> bool:
    """A successful request within every target given (a 1-token request has no TPOT to miss)."""
    if not r.ok or r.ttft is None or r.e2e is None:
        return False
    if slo.ttft_ms is not None and r.ttft * 1000 > slo.ttft_ms:
        return False
    t = tpot(r)
    if slo.tpot_ms is not None and t is not None and t * 1000 > slo.tpot_ms:
        return False
    if slo.e2e_ms is not None and r.e2e * 1000 > slo.e2e_ms:
        return False
    return True


@attrs.frozen
class Summary:
    """The figures of one run (latencies in milliseconds, rates per second)."""

    completed: int
    failed: int
    duration_s: float
    req_per_s: float
    out_tok_per_s: float
    in_tok_per_s: float
    goodput: float | None  # None when no SLO was given
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    ttft_mean_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    cached_token_ratio: float | None  # client-side prefix reuse: cached / prompt tokens


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def summarize(records: Iterable[RequestRecord], duration: float, slo: Slo = Slo()) -> Summary:
    """Figures over the measured requests of one run (pass warm-up-free records)."""
    rs = list(records)
    ok = [r for r in rs if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    itls = [g for r in ok for g in r.itl]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    with_cache = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    cached = (sum(r.cached_tokens or 0 for r in with_cache) / sum(r.prompt_tokens or 0 for r in with_cache)
              if with_cache else None)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    return Summary(
        completed=len(ok),
        failed=len(rs) - len(ok),
        duration_s=duration,
        req_per_s=per_s(len(ok)),
        out_tok_per_s=per_s(out_tokens),
        in_tok_per_s=per_s(in_tokens),
        goodput=None if slo.empty else per_s(sum(1 for r in ok if meets_slo(r, slo))),
        ttft_p50_ms=_ms(percentile(ttfts, 50)),
        ttft_p99_ms=_ms(percentile(ttfts, 99)),
        ttft_mean_ms=_ms(mean(ttfts)),
        tpot_p50_ms=_ms(percentile(tpots, 50)),
        tpot_p99_ms=_ms(percentile(tpots, 99)),
        itl_p50_ms=_ms(percentile(itls, 50)),
        itl_p99_ms=_ms(percentile(itls, 99)),
        e2e_p50_ms=_ms(percentile(e2es, 50)),
        e2e_p99_ms=_ms(percentile(e2es, 99)),
        cached_token_ratio=cached,
    )


def run_summary(run: RunResult, slo: Slo) -> Summary:
    """One run's figures over its measured requests: what the report, the plots and the verdicts read."""
    return summarize(run.measured(), run.duration, slo)


def counter_delta_ratio(hits_before: float | None, hits_after: float | None,
                        queries_before: float | None, queries_after: float | None) -> float | None:
    """Prefix hit rate over a run from two scrapes of cumulative counters; None when unknown
    (a counter missing) or undefined (no queries in between)."""
    if None in (hits_before, hits_after, queries_before, queries_after):
        return None
    queries = queries_after - queries_before  # type: ignore[operator]
    if queries <= 0:
        return None
    return (hits_after - hits_before) / queries  # type: ignore[operator]


def cells_per_session(samples: Iterable[tuple[float, float]]) -> dict[str, float | None]:
    """KV cells per running session from (used cells, running sessions) samples: mean and max
    over the samples that had a session running."""
    ratios = [used / running for used, running in samples if running > 0]
    return {"mean": mean(ratios), "max": max(ratios) if ratios else None, "samples": len(ratios)}
