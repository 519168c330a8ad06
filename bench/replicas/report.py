"""summary.md and the plots of a replica benchmark run, from its cells' JSON alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import attrs

from bench.gate.metrics import Slo

from .summary import CellSummary, Check, _fmt


def markdown(meta: dict[str, Any], slo: Slo, rows: Sequence[CellSummary], checks: Sequence[Check]) -> str:
    lines = [
        f"# Replicas behind sglang-router: multi-turn chat ({meta['model']})", "",
        f"Command: `{meta['command']}`", "",
        f"Machine: {meta['machine']} ({meta['isa']}), {meta['cpus']} CPUs; sglang-router {meta['router_version']}; "
        f"commit {meta['commit']}.",
        f"Workload: {meta['workload']}.",
        f"Each replica: `skippy serve {' '.join(meta['serve_args'])}`; {meta['total_threads']} threads split over the "
        "replicas (at least one each: 4 replicas oversubscribe 2 cores, so read latencies as relative between "
        "policies at the same replica count).",
        f"SLO (the gate's scaled rule on one session alone through one replica): TTFT <= {slo.ttft_ms:.0f} ms, "
        f"TPOT <= {slo.tpot_ms:.1f} ms.", "",
        "## Done-when checks", "",
        "| check | value | threshold | result | detail |", "|---|---|---|---|---|",
    ]
    for c in checks:
        op = ">=" if "hit rate" in c.name else "<="
        lines.append(f"| {c.name} | {_fmt(c.value)} | {op} {c.threshold:g} | {'PASS' if c.passed else 'FAIL'} "
                     f"| {c.detail} |")
    lines += ["", "## Every cell", "",
              "| sessions | replicas | policy | round | requests | errors | hit rate | prompt tokens | prefilled "
              "| TTFT p50 ms | TTFT p99 ms | follow-up TTFT p50 ms | TPOT p50 ms | goodput req/s | req/s "
              "| preemptions | routed (per replica) |",
              "|" + "---|" * 17]
    for r in rows:
        routed = " / ".join(f"{v:.0f}" for _, v in sorted(r.routed.items()))
        lines.append(
            f"| {r.sessions} | {r.replicas} | {r.policy if r.replicas > 1 else '(one replica)'} | {r.round} "
            f"| {r.requests} | {r.errors} | {_fmt(r.hit_rate)} | {r.prompt_tokens} | {r.prefilled} "
            f"| {_fmt(r.ttft_p50_ms, 0)} | {_fmt(r.ttft_p99_ms, 0)} | {_fmt(r.followup_ttft_p50_ms, 0)} "
            f"| {_fmt(r.tpot_p50_ms, 1)} | {_fmt(r.goodput)} | {r.throughput:.3f} | {r.preemptions} | {routed} |")
    lines += ["", "Hit rate: the replicas' `skippy_prefix_cache_hits_tokens_total` over "
              "`skippy_prefix_cache_queries_tokens_total`, summed, over the measured phase. Prefilled: "
              "`skippy_prompt_tokens_total` summed. Routed: the router's `smg_worker_cb_outcomes_total` (success) "
              "per replica. Raw router counters are in each cell's JSON."]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[CellSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = (("hit_rate", "prefix hit rate"), ("prefilled", "prompt tokens prefilled"),
            ("ttft_p50_ms", "TTFT p50 (ms)"), ("goodput", "goodput (req/s in SLO)"))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8))
    policies = sorted({r.policy for r in rows if r.replicas > 1})
    for ax, (key, label) in zip(axes, keys):
        for s in sorted({r.sessions for r in rows}):
            single = [getattr(r, key) for r in rows if r.sessions == s and r.replicas == 1]
            for p in policies:
                pts = sorted((r.replicas, getattr(r, key)) for r in rows
                             if r.sessions == s and r.replicas > 1 and r.policy == p and getattr(r, key) is not None)
                if single and single[0] is not None:
                    pts = [(1, single[0])] + pts
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=f"{s} sessions, {p}")
        ax.set_xlabel("replicas")
        ax.set_title(label)
        ax.set_xscale("log", base=2)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rows_json(rows: Sequence[CellSummary], checks: Sequence[Check]) -> dict[str, Any]:
    return {"rows": [attrs.asdict(r) for r in rows], "checks": [attrs.asdict(c) for c in checks]}
