"""Counting and grouping a round's outcomes (pure): status counts, per-priority latency, the
parity sample, and the one-line-per-invariant roll-up over rounds both drivers print."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from .invariants import Check
from .outcomes import ALLOWED, COMPLETED, Outcome
from .workload import Job


def statuses(outcomes: Sequence[Outcome]) -> dict[str, int]:
    return dict(sorted(Counter(o.status for o in outcomes).items()))


def ttft_by_priority(outcomes: Sequence[Outcome]) -> dict[int, float]:
    """Mean seconds to the first token of completed requests, per priority class (informational:
    higher priorities should start sooner, but timing on a shared box is not asserted)."""
    by: dict[int, list[float]] = {}
    for o in outcomes:
        if o.status == COMPLETED and o.ttft_s is not None:
            by.setdefault(o.priority, []).append(o.ttft_s)
    return {p: round(float(np.mean(v)), 4) for p, v in sorted(by.items())}


def not_fine(outcomes: Sequence[Outcome], jobs: Sequence[Job]) -> list[Outcome]:
    """Outcomes a check will complain about (for the report's list of failures)."""
    kinds = {j.id: j.kind for j in jobs}
    return [o for o in outcomes
            if o.status not in ALLOWED.get(kinds.get(o.job_id, ""), ()) or o.finish_reason == "error"]


def greedy_sample(outcomes: Sequence[Outcome], k: int, rng: np.random.Generator,
                  eligible: set[str] | None = None) -> list[Outcome]:
    """Up to k completed greedy outcomes (optionally only those in `eligible`), chosen by rng."""
    pool = [o for o in outcomes if o.status == COMPLETED and o.greedy and (eligible is None or o.job_id in eligible)]
    if not pool:
        return []
    return [pool[i] for i in sorted(rng.choice(len(pool), size=min(k, len(pool)), replace=False))]


def roll_up(checks: Sequence[Check]) -> list[Check]:
    """'round R: NAME' checks -> one 'all rounds: NAME' check each, quoting the first failures."""
    names: dict[str, list[Check]] = {}
    for c in checks:
        names.setdefault(c.name.split(": ", 1)[1], []).append(c)
    out = []
    for name, cs in names.items():
        failed = [c for c in cs if not c.ok]
        detail = f"{len(cs) - len(failed)}/{len(cs)} rounds"
        if failed:
            detail += "; " + " | ".join(c.name.split(":")[0] + ": " + c.detail for c in failed[:3])
        out.append(Check(f"all rounds: {name}", not failed, detail))
    return out


def per_round(r: int, checks: Sequence[Check]) -> list[Check]:
    return [Check(f"round {r}: {c.name}", c.ok, c.detail) for c in checks]
