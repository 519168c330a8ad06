"""What one cell's JSON says, and the issue's two done-when checks: pure (no I/O), unit-tested.

Prefix hit rate is the replicas' own counters summed: prompt tokens served from a shared prefix
over prompt tokens looked up, over the measured phase. TTFT, TPOT and goodput are the gate's
definitions (bench.gate.metrics) over the client's records; the SLO is the gate's scaled one,
measured on a single replica serving one session alone (the calibration cell).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import attrs

from bench.gate.metrics import Slo, meets_slo, percentile, tpot
from bench.gate.records import RequestRecord
from bench.gate.verdict import SloScale

HIT_RATE_FLOOR = 0.9  # cache_aware at the most replicas >= this x the single replica's hit rate
TTFT_CEILING = 0.5  # cache_aware's TTFT p50 there <= this x round_robin's


def _record(data: dict[str, Any]) -> RequestRecord:
    return RequestRecord.from_json({k: v for k, v in data.items() if k not in ("session", "turn")})


def calibrated_slo(calibration: dict[str, Any], scale: SloScale = SloScale()) -> Slo:
    """The gate's scaled SLO from the one-session cell: multiples of its p50 TTFT and TPOT."""
    recs = [_record(r) for r in calibration["records"]]
    ttfts = [r.ttft * 1000 for r in recs if r.ok and r.ttft is not None]
    tpots = [t * 1000 for r in recs if r.ok and (t := tpot(r)) is not None]
    if not ttfts or not tpots:
        raise ValueError("the calibration cell has no successful request")
    return Slo(scale.ttft_x * percentile(ttfts, 50), scale.tpot_x * percentile(tpots, 50))


@attrs.frozen
class CellSummary:
    key: str
    sessions: int
    replicas: int
    policy: str
    round: int
    requests: int
    errors: int
    hit_rate: float | None  # prefix hit tokens / prompt tokens looked up (replicas' counters)
    prefilled: int  # prompt tokens computed, all replicas
    prompt_tokens: int  # prompt tokens sent (client's usage)
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    followup_ttft_p50_ms: float | None  # turns 2.. only: where a prefix can be reused
    tpot_p50_ms: float | None
    goodput: float | None  # requests/s within the SLO
    throughput: float  # successful requests/s
    wall_s: float
    routed: dict[str, float]  # requests each replica answered (the router's circuit-breaker outcomes)
    preemptions: int


def summarize_cell(cell: dict[str, Any], slo: Slo | None) -> CellSummary:
    recs = [(_record(r), r["turn"]) for r in cell["records"]]
    ok = [(r, t) for r, t in recs if r.ok]
    ttfts = [r.ttft * 1000 for r, _ in ok if r.ttft is not None]
    follow = [r.ttft * 1000 for r, t in ok if r.ttft is not None and t >= 2]
    tpots = [x * 1000 for r, _ in ok if (x := tpot(r)) is not None]
    reps = cell["replicas"].values()
    queries = sum(d["prefix_queries"] for d in reps)
    routed = {labels.get("worker", "?"): v for labels, v in cell["router_after"].get("smg_worker_cb_outcomes_total", [])
              if labels.get("outcome") == "success"}
    for labels, v in cell["router_before"].get("smg_worker_cb_outcomes_total", []):
        if labels.get("outcome") == "success" and labels.get("worker") in routed:
            routed[labels["worker"]] -= v
    wall = cell["wall_s"]
    c = cell["cell"]
    return CellSummary(
        key=cell["key"], sessions=c["sessions"], replicas=c["replicas"], policy=c["policy"], round=c["round"],
        requests=len(recs), errors=len(recs) - len(ok),
        hit_rate=sum(d["prefix_hits"] for d in reps) / queries if queries else None,
        prefilled=int(sum(d["prefilled"] for d in reps)),
        prompt_tokens=int(sum(r.prompt_tokens or 0 for r, _ in ok)),
        ttft_p50_ms=percentile(ttfts, 50), ttft_p99_ms=percentile(ttfts, 99), followup_ttft_p50_ms=percentile(follow, 50),
        tpot_p50_ms=percentile(tpots, 50),
        goodput=None if slo is None else sum(meets_slo(r, slo) for r, _ in ok) / wall,
        throughput=len(ok) / wall, wall_s=wall, routed=routed,
        preemptions=int(sum(d["preemptions"] for d in reps)))


@attrs.frozen
class Check:
    name: str
    value: float | None
    threshold: float
    passed: bool
    detail: str


def _median(values: Sequence[float]) -> float | None:
    return percentile(list(values), 50)


def done_checks(rows: Iterable[CellSummary]) -> list[Check]:
    """Per session count, at the most replicas run: cache_aware's hit rate against the single
    replica's, and its TTFT p50 against round_robin's (medians over rounds)."""
    rows = list(rows)
    checks: list[Check] = []
    for s in sorted({r.sessions for r in rows}):
        mine = [r for r in rows if r.sessions == s]
        top = max(r.replicas for r in mine)
        if top < 2:
            continue

        def med(key: str, replicas: int, policy: str | None = None) -> float | None:
            vals = [getattr(r, key) for r in mine if r.replicas == replicas and (policy is None or r.policy == policy)
                    and getattr(r, key) is not None]
            return _median(vals)

        single, aware = med("hit_rate", 1), med("hit_rate", top, "cache_aware")
        ratio = aware / single if aware is not None and single else None
        checks.append(Check(f"{s} sessions, {top} replicas: cache_aware hit rate / 1 replica's", ratio, HIT_RATE_FLOOR,
                            ratio is not None and ratio >= HIT_RATE_FLOOR,
                            f"{_fmt(aware)} vs {_fmt(single)}"))
        a_ttft, rr_ttft = med("ttft_p50_ms", top, "cache_aware"), med("ttft_p50_ms", top, "round_robin")
        ratio = a_ttft / rr_ttft if a_ttft is not None and rr_ttft else None
        checks.append(Check(f"{s} sessions, {top} replicas: cache_aware TTFT p50 / round_robin's", ratio, TTFT_CEILING,
                            ratio is not None and ratio <= TTFT_CEILING,
                            f"{_fmt(a_ttft, 0)} ms vs {_fmt(rr_ttft, 0)} ms"))
    return checks


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
