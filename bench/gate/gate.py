"""The cutover gate over a results directory: per engine pair and workload, pass or fail. Pure.

For each (new, reference) pair of PAIRS whose two engines are in the results (skippy against
single-lane, llama-server and llama-server-stock; skippy-fast against both llama-servers), on
every closed-loop workload of the sweep:
  throughput@N   new out tok/s >= ratio x reference, at the target N (against single-lane the
                 ratio is min(2, 0.9 x H), H the hardware's batching headroom: gate.headroom)
  goodput@N      new goodput >= ratio x reference, at the target N (needs an SLO)
  p99 TTFT@N     new p99 TTFT <= reference x (1 + slack), or <= 1.3 x while new ITL p99 <=
                 0.25 x the reference's, at the target N
  N=1            new out tok/s >= (1 - tolerance) x reference: no single-user regression
  curve          the same at every N both ran: the new curve dominates everywhere
  no failures    new failed no request at any N
A check without data (an N not swept, no SLO) fails: absent evidence never passes the gate.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import attrs

from .engines import FAST, NEW, OLD, PEER, STOCK
from .headroom import SHARE, Headroom, scaled_ratio
from .metrics import Summary


@attrs.frozen
class Thresholds:
    throughput_ratio: float
    goodput_ratio: float
    p99_ttft_slack: float = 0.0
    n1_tolerance: float = 0.05
    # the ruling on p99 TTFT in the N* burst: up to this x the reference while ITL p99 stays within
    # ITL_SHARE x the reference's (the latency traded for smooth streams, made from the targets)
    p99_ttft_traded: float = 1.3
    itl_share: float = 0.25


# the seed's proposed margins: >= 2x throughput at N=32 with equal-or-better p99 against the old
# engine, and raw throughput at or above llama-server's on the same work; no N=1 regression
DEFAULTS: dict[str, Thresholds] = {OLD: Thresholds(2.0, 1.0), PEER: Thresholds(1.0, 1.0), STOCK: Thresholds(1.0, 1.0)}

# (new, reference): the batch-invariant skippy against the old engine and both llama-servers; the
# skippy with the default kernels against the llama-servers (the per-token path, kernels equal)
PAIRS: tuple[tuple[str, str], ...] = ((NEW, OLD), (NEW, PEER), (NEW, STOCK), (FAST, PEER), (FAST, STOCK))


@attrs.frozen
class Check:
    reference: str
    workload: str
    name: str
    passed: bool
    new: float | None
    ref: float | None
    requirement: str
    engine: str = NEW  # the new side of the pair


Key = tuple[str, str, str, float]  # (engine, workload, load kind, x)


def min_ratio_check(engine: str, reference: str, workload: str, name: str, new: float | None, ref: float | None,
                    minimum: float, what: str) -> Check:
    """new >= minimum x reference; either side missing fails (0 against 0 passes)."""
    ok = new is not None and ref is not None and new >= minimum * ref
    return Check(reference, workload, name, ok, new, ref, f"{what} >= {minimum:g} x reference", engine)


def p99_ttft_check(engine: str, reference: str, workload: str, name: str, new: Summary | None, ref: Summary | None,
                   th: Thresholds) -> Check:
    """p99 TTFT <= (1 + slack) x the reference's, or <= p99_ttft_traded x it while ITL p99 <= itl_share x
    the reference's (the ruling: latency to the first token traded for smooth streams)."""
    n, r = new and new.ttft_p99_ms, ref and ref.ttft_p99_ms
    n_itl, r_itl = new and new.itl_p99_ms, ref and ref.itl_p99_ms
    smooth = n_itl is not None and r_itl is not None and n_itl <= th.itl_share * r_itl
    ok = n is not None and r is not None and (n <= r * (1 + th.p99_ttft_slack) or (smooth and n <= r * th.p99_ttft_traded))
    what = (f"p99 TTFT ms <= {1 + th.p99_ttft_slack:g} x reference, or <= {th.p99_ttft_traded:g} x while ITL p99 <= "
            f"{th.itl_share:g} x (ITL p99 {_num(n_itl)} vs {_num(r_itl)} ms)")
    return Check(reference, workload, name, ok, n, r, what, engine)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def pair_checks(runs: Mapping[Key, Summary], reference: str, workload: str, at_n: int,
                th: Thresholds, engine: str = NEW, headroom: Headroom | None = None) -> list[Check]:
    """The checks of `engine` (the new side) against `reference` on one workload's closed-loop runs;
    `headroom` (the hardware's batching headroom H) scales the throughput ratio asked of it."""
    def get(name: str, n: float) -> Summary | None:
        return runs.get((name, workload, "closed", float(n)))

    def ratio_check(name: str, new: float | None, ref: float | None, minimum: float, what: str) -> Check:
        return min_ratio_check(engine, reference, workload, name, new, ref, minimum, what)

    new, ref = get(engine, at_n), get(reference, at_n)
    wanted = scaled_ratio(th.throughput_ratio, headroom)
    throughput = ratio_check(f"throughput@N={at_n}", new and new.out_tok_per_s, ref and ref.out_tok_per_s,
                             wanted, "out tok/s")
    if headroom is not None and wanted < th.throughput_ratio:
        throughput = attrs.evolve(throughput, requirement=(
            f"{throughput.requirement} (min({th.throughput_ratio:g}, {SHARE:g} x H), H = {headroom.h:.2f}: "
            f"llama-batched-bench {headroom.speed_n:.0f} tok/s at B={headroom.at_n} over {headroom.speed_1:.0f} "
            f"at B=1; `{headroom.command}`)"))
    checks = [
        throughput,
        ratio_check(f"goodput@N={at_n}", new and new.goodput, ref and ref.goodput, th.goodput_ratio, "goodput"),
        p99_ttft_check(engine, reference, workload, f"p99 TTFT@N={at_n}", new, ref, th),
    ]
    floor = 1 - th.n1_tolerance
    new1, ref1 = get(engine, 1), get(reference, 1)
    checks.append(ratio_check("N=1 no regression", new1 and new1.out_tok_per_s, ref1 and ref1.out_tok_per_s,
                              floor, "out tok/s"))
    pairs = [(n, a, b) for n in sorted({k[3] for k in runs if k[1] == workload and k[2] == "closed"})
             if (a := get(engine, n)) is not None and (b := get(reference, n)) is not None]
    behind = [n for n, a, b in pairs if a.out_tok_per_s < floor * b.out_tok_per_s]
    worst = min(pairs, key=lambda p: p[1].out_tok_per_s / max(p[2].out_tok_per_s, 1e-9), default=None)
    checks.append(Check(reference, workload, "curve dominates", bool(pairs) and not behind,
                        worst and worst[1].out_tok_per_s, worst and worst[2].out_tok_per_s,
                        f"out tok/s >= {floor:g} x reference at every N"
                        + (f" (behind at N={', '.join(f'{n:g}' for n in behind)})" if behind else ""), engine))
    failed = sum(s.failed for k, s in runs.items() if k[0] == engine and k[1] == workload and k[2] == "closed")
    checks.append(Check(reference, workload, "no failed requests", bool(pairs) and failed == 0, float(failed), None,
                        "new fails no request at any N", engine))
    return checks


def gate(runs: Mapping[Key, Summary], at_n: int, thresholds: Mapping[str, Thresholds],
         workloads: Sequence[str] | None = None, pairs: Sequence[tuple[str, str]] = PAIRS,
         headrooms: Mapping[str, Headroom] | None = None) -> list[Check]:
    """Every check for every (new, reference) pair whose engines are both in the results and
    whose reference has thresholds; `headrooms` (per workload) scale the ratio against single-lane."""
    present = {k[0] for k in runs}
    names = workloads or list(dict.fromkeys(k[1] for k in runs if k[2] == "closed"))
    hs = headrooms or {}
    return [c for new, ref in pairs if new in present and ref in present and ref in thresholds
            for w in names for c in pair_checks(runs, ref, w, at_n, thresholds[ref], new,
                                                hs.get(w) if ref == OLD else None)]


def render(checks: Sequence[Check]) -> str:
    """One line per check, grouped by pair, and the verdict per pair."""
    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:.3g}"

    lines = []
    for new, ref in dict.fromkeys((c.engine, c.reference) for c in checks):
        mine = [c for c in checks if (c.engine, c.reference) == (new, ref)]
        verdict = "PASS" if all(c.passed for c in mine) else "FAIL"
        lines.append(f"== {new} vs {ref}: {verdict} ({sum(c.passed for c in mine)}/{len(mine)} checks)")
        for c in mine:
            lines.append(f"  {'pass' if c.passed else 'FAIL'}  {c.workload:<14} {c.name:<22} {new} {num(c.new):>8}  "
                         f"{ref} {num(c.ref):>8}   need {c.requirement}")
    if not checks:
        lines.append("no engine pair to judge: the results need one of "
                     + ", ".join(f"{new} and {ref}" for new, ref in PAIRS))
    return "\n".join(lines)
