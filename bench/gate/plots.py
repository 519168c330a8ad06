"""PNG plots: per workload and arrival process, six panels against N (or rate), one line per engine.

Panels: output tok/s (with llama-batched-bench decode tok/s as the hardware reference),
goodput, TTFT p50/p99, TPOT p50/p99. The whole curve is the evidence, not one point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from .metrics import Slo, Summary, run_summary  # noqa: E402
from .records import RunResult  # noqa: E402

PANELS: tuple[tuple[str, str], ...] = (
    ("out_tok_per_s", "output tok/s"),
    ("goodput", "goodput (req/s within SLO)"),
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p50_ms", "TPOT p50 (ms)"),
    ("tpot_p99_ms", "TPOT p99 (ms)"),
)
STYLE = {"skippy": "C0", "skippy-fast": "C0", "single-lane": "C1", "llama-server": "C2", "llama-server-stock": "C2"}
DASHED = {"skippy-fast", "llama-server-stock"}  # the variant of the engine of the same colour


def _reference(batched: list[dict[str, Any]], pp: int | None, tg: int | None) -> list[tuple[int, float]]:
    for entry in batched:
        if entry.get("pp") == pp and entry.get("tg") == tg:
            return sorted((int(r["pl"]), float(r["speed_tg"])) for r in entry.get("rows", []))
    return []


def plot_workload(path: Path, workload: str, kind: str, runs: Sequence[RunResult], slo: Slo,
                  reference: list[tuple[int, float]]) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    engines = list(dict.fromkeys(r.engine for r in runs))
    series: dict[str, list[tuple[float, Summary]]] = {
        e: sorted(((r.load.x, run_summary(r, slo)) for r in runs if r.engine == e), key=lambda p: p[0])
        for e in engines}
    for ax, (field, title) in zip(axes.flat, PANELS):
        for engine, points in series.items():
            xy = [(x, getattr(s, field)) for x, s in points if getattr(s, field) is not None]
            if xy:
                ax.plot(*zip(*xy), marker="o", label=engine, color=STYLE.get(engine),
                        linestyle="--" if engine in DASHED else "-")
        if field == "out_tok_per_s" and reference and kind == "closed":
            ax.plot(*zip(*reference), linestyle="--", color="gray", label="llama-batched-bench decode")
        ax.set_title(title)
        ax.set_xlabel("concurrency N (closed loop)" if kind == "closed" else "arrival rate (req/s, Poisson)")
        if kind == "closed":
            ax.set_xscale("log", base=2)
            xs = sorted({x for points in series.values() for x, _ in points})
            ax.set_xticks(xs, [f"{x:g}" for x in xs])  # 1 2 4 8, not 2^0 2^1 ...
            ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{workload} ({'closed loop' if kind == 'closed' else 'open loop'})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_plots(out: Path, runs: Sequence[RunResult], batched: list[dict[str, Any]], slo: Slo,
                shapes: dict[str, tuple[int, int]]) -> list[Path]:
    """One PNG per (workload, arrival process) present in `runs`; `shapes`: workload -> (prompt,
    output) lengths, to pick the batched-bench reference of the same shape. Returns the paths."""
    written = []
    for workload in dict.fromkeys(r.workload for r in runs):
        for kind in ("closed", "poisson"):
            selected = [r for r in runs if r.workload == workload and r.load.kind == kind]
            if not selected:
                continue
            pp, tg = shapes.get(workload, (None, None))
            path = out / f"{workload}-{kind}.png"
            plot_workload(path, workload, kind, selected, slo, _reference(batched, pp, tg))
            written.append(path)
    return written

