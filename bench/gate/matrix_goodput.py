"""The matrix's goodput run: open-loop Poisson arrivals at fractions of each class's capacity.

Why: the closed-loop run at N* keeps every engine past capacity, so its goodput is ~0 for all
and compares nothing. Poisson arrivals at rates around capacity (the same rates for every
engine of the class) show who keeps requests within the SLO as load nears what the hardware
can do. Capacity: the median over the engines other than single-lane (one lane is not the
class's capacity) of the closed-loop req/s at the class's N* on the goodput workload (chat).

Layout: <out>/<class>/goodput/ (a sweep of its own, like overload/); the plan (capacity, N*,
fractions, rates, command) goes into the class's entry of matrix.json under "goodput".
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

from .engines import KNOWN, OLD
from .matrix_dir import GOODPUT_DIR, ClassData
from .metrics import Slo, run_summary
from .records import RunResult
from .report import load_results
from .sweep import SweepOptions, run_sweep
from .verdict import ClassVerdict
from .workloads import Workload

GOODPUT_FRACTIONS = {False: (0.5, 0.8, 1.0), True: (1.0,)}  # (full, quick)


@attrs.frozen
class GoodputPlan:
    """The Poisson rates of one class, as fractions of its measured capacity."""

    workload: str
    at_n: int
    capacity: float  # req/s
    fractions: tuple[float, ...] = attrs.field(converter=tuple)
    rates: tuple[float, ...] = attrs.field(converter=tuple)

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "fractions": list(self.fractions), "rates": list(self.rates)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GoodputPlan:
        return cls(data["workload"], data["at_n"], data["capacity"], data["fractions"], data["rates"])


def chat_workload(workloads: Sequence[Workload]) -> tuple[Workload, ...]:
    """Chat alone, else the first workload: what the overload and goodput runs load."""
    return tuple(w for w in workloads if w.name == "chat") or tuple(workloads[:1])


def capacity(runs: Sequence[RunResult], workload: str, at_n: int) -> float | None:
    """The median closed-loop req/s at `at_n` on `workload` over the engines but single-lane."""
    rates = [run_summary(r, Slo()).req_per_s for r in runs
             if r.engine != OLD and r.workload == workload and r.load.kind == "closed" and r.load.n == at_n]
    return statistics.median(rates) if rates else None


def goodput_rates(cap: float, fractions: Sequence[float]) -> tuple[float, ...]:
    """fraction x capacity, to 4 significant digits (readable labels and log names)."""
    return tuple(float(f"{f * cap:.4g}") for f in fractions)


def goodput_plan(runs: Sequence[RunResult], workload: str, at_n: int, fractions: Sequence[float]) -> GoodputPlan | None:
    """None when the closed loop has no run to measure capacity on (or measured none)."""
    cap = capacity(runs, workload, at_n)
    if not cap:
        return None
    return GoodputPlan(workload, at_n, cap, tuple(fractions), goodput_rates(cap, fractions))


def goodput_options(sweep: SweepOptions, rates: Sequence[float]) -> SweepOptions:
    """The class's sweep turned into its goodput run: every engine, chat only, Poisson at `rates`
    (llama-server at `-np open_slots`), no closed loop."""
    return attrs.evolve(sweep, out=sweep.out / GOODPUT_DIR, workloads=chat_workload(sweep.workloads),
                        concurrency=(), rates=tuple(rates), slots=None, batched_bench=False)


async def run_goodput(sweep: SweepOptions, entry: dict[str, Any], fractions: Sequence[float], at_n: int,
                      save: Callable[[], None]) -> GoodputPlan | None:
    """Capacity from the class's closed-loop results.json, then the Poisson run; the plan goes
    into `entry` (saved before the run, so an interrupted one still says what it was doing)."""
    started = time.monotonic()
    workload = chat_workload(sweep.workloads)[0].name
    plan = goodput_plan(load_results(sweep.out)[1], workload, at_n, fractions)
    if plan is None:
        print(f"bench: {sweep.out.name}: no closed-loop {workload} run at N={at_n}: goodput not run", file=sys.stderr)
        return None
    entry["goodput"] = {**plan.to_json(), "command": ["python", "-m", "bench.gate", *sys.argv[1:]], "wall_s": None}
    save()
    print(f"bench: {sweep.out.name}: goodput at {', '.join(f'{r:g}' for r in plan.rates)} req/s "
          f"(capacity {plan.capacity:.3g} req/s)", file=sys.stderr)
    await run_sweep(goodput_options(sweep, plan.rates))
    entry["goodput"]["wall_s"] = round(time.monotonic() - started, 1)
    save()
    return plan


def as_swept(sweep: SweepOptions, meta: dict[str, Any], given: Sequence[str] = ()) -> SweepOptions:
    """`sweep` as the class's results.json says it ran (engines, workloads, pool, threads,
    batch) but for what the command line gives (`given`): a goodput-only run is scaled to that
    closed loop, so it must run what the closed loop ran."""
    swept = Path(meta.get("model", {}).get("path", sweep.server.model.path)).name
    if swept != Path(sweep.server.model.path).name:
        raise SystemExit(f"bench: {sweep.out}: the closed loop ran {swept}, not {Path(sweep.server.model.path).name}")
    srv = meta.get("server", {})
    server = attrs.evolve(sweep.server, **{k: srv[k] for k in ("n_ctx", "threads", "n_batch")
                                           if k in srv and k not in given})
    changes: dict[str, Any] = {}
    if "engines" not in given and meta.get("engines"):
        changes["engines"] = tuple(meta["engines"])
    if "workloads" not in given and meta.get("workloads"):
        changes["workloads"] = tuple(Workload(**w) for w in meta["workloads"])
    return attrs.evolve(sweep, server=server, **changes)


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _cell(run: RunResult | None, scaled: Slo | None, fixed: Slo) -> str:
    """goodput under the scaled / fixed SLO · TTFT p99 of one engine at one rate."""
    if run is None:
        return "–"
    s, f = run_summary(run, scaled or Slo()), run_summary(run, fixed)
    return f"{_num(s.goodput, '.2f')} / {_num(f.goodput, '.2f')} · {_num(s.ttft_p99_ms, '.0f')} ms"


def _rows(c: ClassData, v: ClassVerdict, engines: Sequence[str], fixed: Slo) -> list[str]:
    plan = c.entry.get("goodput") or {}
    fraction = dict(zip(plan.get("rates", []), plan.get("fractions", [])))
    cap = plan.get("capacity")
    out = []
    for rate in sorted({r.load.rate for r in c.goodput if r.load.rate}):
        at = {r.engine: r for r in c.goodput if r.load.rate == rate}
        f = fraction.get(rate, rate / cap if cap else None)
        cells = [c.entry["name"], "–" if cap is None else f"{cap:.3g} (N={plan.get('at_n')})", f"{rate:g}",
                 "–" if f is None else f"{f:g}×"]
        slo = v.slos.get(next(iter(at.values())).workload)
        cells += [_cell(at.get(e), slo, fixed) for e in engines]
        out.append("| " + " | ".join(cells) + " |")
    return out


def goodput_lines(rows: Sequence[tuple[ClassData, ClassVerdict]], fixed: Slo) -> list[str]:
    """The summary's goodput section: per class and rate, each engine's goodput (scaled / fixed
    SLO) and TTFT p99; nothing when no class has a goodput run."""
    present = {r.engine for c, _ in rows for r in c.goodput}
    if not present:
        return []
    engines = [e for e in KNOWN if e in present]
    head = "| class | capacity req/s | rate req/s | × capacity | " + " | ".join(engines) + " |"
    lines = ["", "## Goodput: open-loop Poisson arrivals around capacity", "",
             "Capacity: the median closed-loop req/s at N* on chat over the engines but single-lane; every engine "
             "of the class gets the same seeded arrivals at each rate. Cells: goodput req/s under the scaled / fixed "
             "SLO · TTFT p99. The verdict's goodput checks read the highest rate.", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    return lines + [row for c, v in rows for row in _rows(c, v, engines, fixed)]
