"""Staged serving: a pipeline of 2 and 3 stage processes on loopback vs one process.

N sessions arrive together (each its own prompt, G tokens, ignore_eos so lengths are exact).
Per (configuration, N) it records output tok/s, TTFT and TPOT per request, and where the time
went: stage 0's own layers vs waiting for the stages below, and each later stage's busy and
idle time (the `skippy stage` processes print them per session). All configurations run in
one invocation, alternating per N, on the same model. Writes JSON, a markdown table, a plot.

    python bench/pipeline.py [--sessions 1 8 32] [--gen 32]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import time
from pathlib import Path

import numpy as np
import trio

from skippy import open_engine
from skippy.demo import prompt_for
from skippy.models import resolve_model
from skippy.staged import PINNED_SPLITS, balanced_split, layer_costs
from skippy.staged._launch import launch_stages
from skippy.staged._pipeline import open_pipeline, parse_addr

# name -> (stages, threads per stage, micro-batches per step (None = one per stage), split, groups)
# "even": the pinned splits, layers shared evenly; "balanced": balanced_split, the output head
# (8 layers' worth of parameters in SmolLM2) counted on the last stage; groups: engines at stage
# 0 whose steps interleave (cross-step pipelining)
CONFIGS = {
    "one process": (1, 2, None, None, 1),
    "2 stages, even": (2, 1, None, "even", 1),
    "2 stages, balanced": (2, 1, None, "balanced", 1),
    "2 stages, balanced, 2 groups": (2, 1, None, "balanced", 2),
    "3 stages, even": (3, 1, None, "even", 1),
    "3 stages, balanced": (3, 1, None, "balanced", 1),
    "3 stages, balanced, no micro-batches": (3, 1, 1, "balanced", 1),
    "3 stages, balanced, 2 groups": (3, 1, None, "balanced", 2),
}
STATS = re.compile(r"layers (\d+):(\d+): (\d+) decodes of (\d+) micro-batches, (\d+) tokens, "
                   r"busy ([\d.]+) s, idle ([\d.]+) s")


async def drive(engine, sessions: int, gen: int) -> dict:
    prompts = [engine.tokenize(prompt_for(i)) for i in range(sessions)]
    ttft, tpot = [], []
    started = time.perf_counter()

    async def one(p) -> None:
        t0 = time.perf_counter()
        stamps = []
        async for event in engine.generate(p, max_tokens=gen, ignore_eos=True):
            if event.token is not None:
                stamps.append(time.perf_counter())
            if event.final and event.finish_reason != "length":
                raise RuntimeError(f"request ended with {event.finish_reason}: {event.error}")
        ttft.append(stamps[0] - t0)
        tpot.append((stamps[-1] - stamps[0]) / max(1, len(stamps) - 1))

    async with trio.open_nursery() as nursery:
        for p in prompts:
            nursery.start_soon(one, p)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "out_tok_per_s": sessions * gen / wall,
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "tpot_p50_s": float(np.percentile(tpot, 50)), "tpot_p99_s": float(np.percentile(tpot, 99))}


async def run_one(path: Path, name: str, sessions: int, gen: int, n_ctx: int) -> dict:
    n_stages, threads, micro, split, groups = CONFIGS[name]
    row: dict = {"config": name, "stages": n_stages, "threads_per_stage": threads, "N": sessions}
    if n_stages == 1:
        async with open_engine(path, n_ctx=n_ctx, n_batch=512, threads=threads, prefix_cache=False) as engine:
            await drive(engine, 1, 2)  # warm-up
            row.update(await drive(engine, sessions, gen))
        return row
    if split == "balanced":
        splits = balanced_split(*layer_costs(path), n_stages)
    elif path.name.startswith("SmolLM2"):
        splits = PINNED_SPLITS["smollm2"][n_stages]
    else:
        raise SystemExit("this bench pins SmolLM2's even splits; give --model smollm2")
    row["split"] = " ".join(f"{a}:{b}" for a, b in splits)
    stages = launch_stages(path, splits, options=["--threads", str(threads), "--n-ctx", str(n_ctx), "--n-batch", "512"])
    try:
        async with open_pipeline(path, splits[0][1], parse_addr(stages[0].addr), n_ctx=n_ctx, n_batch=512,
                                 threads=threads, micro_batches=micro, groups=groups) as engine:
            await drive(engine, groups, 2)  # warm-up, every group
            runtimes = [e.runtime for e in getattr(engine, "engines", [engine])]
            for rt in runtimes:
                rt.compute_s = rt.wait_s = 0.0
            row.update(await drive(engine, sessions, gen))
            row["micro_batches"], row["groups"] = runtimes[0].micro_batches, groups
            row["stage0_compute_s"] = sum(rt.compute_s for rt in runtimes)
            row["stage0_wait_s"] = sum(rt.wait_s for rt in runtimes)
    finally:
        for stage in stages:
            stage.stop()
    busy = []
    for stage in stages:
        lines = [m for m in STATS.finditer(stage.proc.stdout.read())]
        last = lines[-1]  # the measured session (the probe's session does no decode and prints nothing)
        b, i = float(last.group(6)), float(last.group(7))
        busy.append({"layers": f"{last.group(1)}:{last.group(2)}", "decodes": int(last.group(3)),
                     "micro_batches": int(last.group(4)), "busy_s": b, "idle_s": i})
    row["stages_below"] = busy
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sessions", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("bench/results/pipeline"))
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    if args.render_only:
        saved = json.loads((args.out / "results.json").read_text())
        render(saved["rows"], saved["meta"], args.out)
        return
    path = resolve_model(args.model)
    rows = []
    for n in args.sessions:
        for name in CONFIGS:
            row = trio.run(run_one, path, name, n, args.gen, args.n_ctx)
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = (f"python bench/pipeline.py --model {args.model} --sessions {' '.join(map(str, args.sessions))} "
               f"--gen {args.gen} --n-ctx {args.n_ctx}")
    meta = {"model": path.name, "gen": args.gen, "n_ctx": args.n_ctx, "command": command,
            "machine": f"{platform.processor() or platform.machine()}, {_cores()} cores"}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    render(rows, meta, args.out)


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _busy(row: dict) -> str:
    if row["stages"] == 1:
        return "-"
    parts = [f"0: {row['stage0_compute_s'] / row['wall_s']:.0%}"]
    parts += [f"{i + 1}: {s['busy_s'] / row['wall_s']:.0%}" for i, s in enumerate(row["stages_below"])]
    return ", ".join(parts)


def render(rows: list[dict], meta: dict, out: Path) -> None:
    lines = [
        f"# Staged serving: pipeline vs one process ({meta['model']}, G={meta['gen']}, {meta['machine']})", "",
        f"Command: `{meta['command']}`", "",
        "One process runs 2 threads (both cores); each stage process runs 1 thread. Busy share: stage 0's "
        "own layers, then each later stage's decodes, as a share of the run's wall time.", "",
        "| N | configuration | layers | micro-batches | out tok/s | vs one process | TTFT p50 s | TTFT p99 s "
        "| TPOT p50 ms | stage busy share of wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = next(b for b in rows if b["N"] == r["N"] and b["stages"] == 1)
        lines.append(
            f"| {r['N']} | {r['config']} | {r.get('split', '-')} | {r.get('micro_batches', '-')} "
            f"| {r['out_tok_per_s']:.1f} | {r['out_tok_per_s'] / base['out_tok_per_s']:.2f}x "
            f"| {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {1000 * r['tpot_p50_s']:.1f} | {_busy(r)} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plot(rows, out / "throughput.png")
    print("\n".join(lines))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, label, scale in zip(axes, ("out_tok_per_s", "ttft_p50_s", "tpot_p50_s"),
                                     ("output tok/s", "TTFT p50 (s)", "TPOT p50 (ms)"), (1, 1, 1000)):
        for name in dict.fromkeys(r["config"] for r in rows):
            pts = [(r["N"], r[key] * scale) for r in rows if r["config"] == name]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
