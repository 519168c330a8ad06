"""One verdict per KV class of a matrix run: the gate's checks under a hardware-scaled SLO, plus
the overload run. Pure (records in, verdicts out), so it is unit-tested on hand-made runs.

Why a scaled SLO: the seed's fixed SLO (TTFT 2 s, TPOT 200 ms) is a GPU-era figure; on a 2-core
CPU a 300M model's single-user TPOT is already tens of ms, so the fixed SLO either passes every
engine or none. The scaled SLO puts the bar at a multiple of what this hardware does for one
user: per class and workload, TTFT <= `ttft_x` x and TPOT <= `tpot_x` x the median over the
engines of their N=1 p50. One bar for every engine of the class, so goodput compares like with
like; the fixed SLO is reported beside it.

Goodput is judged on open-loop Poisson runs where the class has them (matrix_goodput.py): at
the highest rate (a fraction of the class's capacity) every engine sees the same arrivals, so
the check says who keeps requests within the SLO near capacity. The closed-loop goodput at N*
says nothing there (every engine is past capacity, goodput ~0 for all); it stays the check only
for directories without Poisson runs. At every Poisson rate up to 1.0x capacity, p99 TTFT must
also be <= 1.0x each llama-server's (the gate issue's ruling; past capacity goodput alone counts).
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping, Sequence

import attrs

from .engines import FAST, NEW, PEER, STOCK
from .gate import PAIRS, Check, Key, Thresholds, gate, min_ratio_check
from .headroom import Headroom
from .metrics import Slo, Summary, run_summary
from .records import RunResult

REJECTED = "HTTP 429"  # the waiting queue was full: a clean answer under overload, not a failure


@attrs.frozen
class SloScale:
    """The scaled SLO's rule: multiples of the engines' median N=1 p50 TTFT and TPOT."""

    ttft_x: float = 10.0
    tpot_x: float = 5.0

    def rule(self) -> str:
        return (f"per class and workload, TTFT ≤ {self.ttft_x:g} × and TPOT ≤ {self.tpot_x:g} × the median over "
                "the engines of their N=1 p50 (TTFT, TPOT); one bar for every engine")


def scaled_slo(runs: Iterable[RunResult], workload: str, scale: SloScale) -> Slo | None:
    """The scaled SLO of one workload, from its closed-loop N=1 runs; None without any."""
    ones = [run_summary(r, Slo()) for r in runs
            if r.workload == workload and r.load.kind == "closed" and r.load.n == 1]
    ttfts = [s.ttft_p50_ms for s in ones if s.ttft_p50_ms is not None]
    tpots = [s.tpot_p50_ms for s in ones if s.tpot_p50_ms is not None]
    if not ttfts or not tpots:
        return None
    return Slo(scale.ttft_x * statistics.median(ttfts), scale.tpot_x * statistics.median(tpots))


def class_summaries(runs: Sequence[RunResult], slos: Mapping[str, Slo | None]) -> dict[Key, Summary]:
    """Every run summarized under its workload's SLO (none: goodput absent, so its check fails)."""
    return {(r.engine, r.workload, r.load.kind, r.load.x): run_summary(r, slos.get(r.workload) or Slo())
            for r in runs}


@attrs.frozen
class Overload:
    """One engine's overload run: requests answered, refused with 429, and failed otherwise."""

    engine: str
    n: int
    lanes: int
    ok: int
    rejected: int
    failed: int
    errors: tuple[str, ...] = ()  # a few distinct failure messages

    @property
    def clean(self) -> bool:
        return self.failed == 0 and self.ok > 0


def overload_counts(run: RunResult, lanes: int) -> Overload:
    measured = run.measured()
    rejected = [r for r in measured if r.error is not None and r.error.startswith(REJECTED)]
    failed = [r for r in measured if r.error is not None and not r.error.startswith(REJECTED)]
    errors = tuple(dict.fromkeys(str(r.error)[:120] for r in failed))[:3]
    return Overload(run.engine, run.load.n or 0, lanes, sum(r.ok for r in measured), len(rejected), len(failed),
                    errors)


@attrs.frozen
class ClassVerdict:
    name: str
    at_n: int
    checks: tuple[Check, ...]
    overload: tuple[Overload, ...]
    slos: dict[str, Slo | None] = attrs.field(hash=False)
    goodput_name: str = ""  # the name of its goodput checks (closed loop at N*, or Poisson)

    @property
    def overload_clean(self) -> bool | None:
        """True/False for the skippy engines' overload runs; None when none ran (absent evidence)."""
        mine = [o for o in self.overload if o.engine in (NEW, FAST)]
        return all(o.clean for o in mine) if mine else None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks) and self.overload_clean is True


def goodput_check_name(rate: float, capacity: float | None) -> str:
    """`goodput@1x capacity` (the rate as a fraction of the class's capacity), else by its rate."""
    return f"goodput@{round(rate / capacity, 2):g}x capacity" if capacity else f"goodput@{rate:g} req/s"


def top_rate(poisson: Sequence[RunResult]) -> float | None:
    """The highest Poisson rate run: the one the goodput check reads."""
    return max((r.load.rate for r in poisson if r.load.kind == "poisson" and r.load.rate), default=None)


def poisson_goodput_checks(closed: Sequence[RunResult], poisson: Sequence[RunResult], slos: Mapping[str, Slo | None],
                           thresholds: Mapping[str, Thresholds], capacity: float | None,
                           workloads: Sequence[str] | None = None) -> list[Check]:
    """Per pair, goodput (req/s within the SLO) at the highest Poisson rate; a pair whose engine
    lacks that run fails (absent evidence), as elsewhere."""
    rate = top_rate(poisson)
    if rate is None:
        return []
    at = [r for r in poisson if r.load.kind == "poisson" and r.load.rate == rate]
    workload = at[0].workload
    if workloads and workload not in workloads:
        return []
    good = {r.engine: run_summary(r, slos.get(workload) or Slo()).goodput for r in at}
    present = {r.engine for r in closed} | set(good)
    name, what = goodput_check_name(rate, capacity), f"goodput at {rate:g} req/s Poisson"
    return [min_ratio_check(new, ref, workload, name, good.get(new), good.get(ref), thresholds[ref].goodput_ratio,
                            what) for new, ref in PAIRS if new in present and ref in present and ref in thresholds]


def poisson_ttft_checks(closed: Sequence[RunResult], poisson: Sequence[RunResult], slos: Mapping[str, Slo | None],
                        capacity: float | None, thresholds: Mapping[str, Thresholds] | None = None,
                        up_to: float = 1.0) -> list[Check]:
    """Per pair against a llama-server whose engines the class ran, p99 TTFT <= (1 + the pair's
    p99_ttft_slack, 0 by default) x at each Poisson rate <= `up_to` x capacity; none without a
    capacity (no fraction to judge by). A pair whose engine lacks the run fails."""
    present = {r.engine for r in closed} | {r.engine for r in poisson}
    if not capacity:
        return []
    by_rate: dict[float, dict[str, Summary]] = {}
    for r in poisson:
        if r.load.kind == "poisson" and r.load.rate and round(r.load.rate / capacity, 2) <= up_to:
            by_rate.setdefault(r.load.rate, {})[r.engine] = run_summary(r, slos.get(r.workload) or Slo())
    workload = next((r.workload for r in poisson), "")
    checks = []
    for rate, got in sorted(by_rate.items()):
        name = f"p99 TTFT@{round(rate / capacity, 2):g}x capacity"
        for new, ref in PAIRS:
            if ref not in (PEER, STOCK) or not {new, ref} <= present:
                continue
            n, o = got.get(new), got.get(ref)
            a, b = n and n.ttft_p99_ms, o and o.ttft_p99_ms
            limit = 1 + (thresholds[ref].p99_ttft_slack if thresholds and ref in thresholds else 0.0)
            checks.append(Check(ref, workload, name, a is not None and b is not None and a <= limit * b, a, b,
                                f"p99 TTFT ms <= {limit:g} x reference at {rate:g} req/s Poisson", new))
    return checks


def class_verdict(name: str, runs: Sequence[RunResult], overload_runs: Sequence[RunResult], lanes: int, at_n: int,
                  thresholds: Mapping[str, Thresholds], scale: SloScale,
                  slo_override: Slo | None = None, workloads: Sequence[str] | None = None,
                  goodput_runs: Sequence[RunResult] = (), capacity: float | None = None,
                  headrooms: Mapping[str, Headroom] | None = None) -> ClassVerdict:
    """The gate's checks on every closed-loop workload at `at_n` under the scaled SLO (or
    `slo_override`), goodput from the Poisson runs where there are any, and each engine's
    overload counts."""
    names = list(dict.fromkeys([r.workload for r in runs if r.load.kind == "closed"]
                               + [r.workload for r in goodput_runs]))
    slos = {w: slo_override or scaled_slo(runs, w, scale) for w in names}
    checks = gate(class_summaries(runs, slos), at_n, thresholds, workloads, headrooms=headrooms)
    goodput_name = f"goodput@N={at_n}"
    if (rate := top_rate(goodput_runs)) is not None:
        checks = [c for c in checks if c.name != goodput_name]
        checks += poisson_goodput_checks(runs, goodput_runs, slos, thresholds, capacity, workloads)
        checks += poisson_ttft_checks(runs, goodput_runs, slos, capacity, thresholds)
        goodput_name = goodput_check_name(rate, capacity)
    return ClassVerdict(name, at_n, tuple(checks), tuple(overload_counts(r, lanes) for r in overload_runs), slos,
                        goodput_name)


def ratio(checks: Sequence[Check], engine: str, reference: str, name: str) -> float | None:
    """The worst new/reference ratio of one check over the workloads; None when any lacks data."""
    mine = [c for c in checks if c.engine == engine and c.reference == reference and c.name == name]
    if not mine or any(c.new is None or not c.ref for c in mine):
        return None
    return min(c.new / c.ref for c in mine)  # type: ignore[operator]


def all_passed(checks: Sequence[Check], prefix: str, engine: str = NEW) -> bool | None:
    """Whether every check whose name starts with `prefix` passed for `engine`; None if none."""
    mine = [c for c in checks if c.engine == engine and c.name.startswith(prefix)]
    return all(c.passed for c in mine) if mine else None
