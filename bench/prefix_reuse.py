"""Prefix reuse: a shared system prompt with the prefix cache on vs off, side by side.

N sessions arrive together; each prompt is the same S-token system prompt plus its own
question, and generates G tokens (ignore_eos, so lengths are exact). For each (S, N) the
engine runs once with the cache off and once on, in the same process on the same model,
alternating, and records TTFT per request, prompt tokens computed (prefill), prefix hit
tokens and peak KV cells. Writes JSON, a markdown table and a plot.

    python bench/prefix_reuse.py [--system 512 1024] [--sessions 8 32] [--gen 16]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import trio

from skippy import open_engine
from skippy.demo import prompt_for, shared_prefix
from skippy.kv import ComponentKind
from skippy.models import resolve_model
from skippy.native import Model


async def run(model: Model, system_tokens: int, sessions: int, gen: int, cache: bool, threads: int,
              n_ctx: int) -> dict:
    ttft: list[float] = []
    async with open_engine(model, n_ctx=n_ctx, n_batch=512, threads=threads, prefix_cache=cache) as engine:
        system = shared_prefix(engine, system_tokens)
        prompts = [np.concatenate([system, engine.tokenize(" " + prompt_for(i), add_special=False)])
                   for i in range(sessions)]
        started = time.perf_counter()

        async def one(p: np.ndarray) -> None:
            t0 = time.perf_counter()
            first = True
            async for event in engine.generate(p, max_tokens=gen, ignore_eos=True):
                if first and event.token is not None:
                    ttft.append(time.perf_counter() - t0)
                    first = False
                if event.final and event.finish_reason != "length":
                    raise RuntimeError(f"request ended with {event.finish_reason}: {event.error}")

        async with trio.open_nursery() as nursery:
            for p in prompts:
                nursery.start_soon(one, p)
        elapsed = time.perf_counter() - started
        stats = engine.stats()
    return {
        "system": system_tokens, "N": sessions, "cache": cache,
        "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
        "prefill_tokens": stats.prefill_tokens, "prompt_tokens": int(sum(p.size for p in prompts)),
        "prefix_hit_tokens": stats.prefix_hits,
        "kv_cells_peak": stats.kv_used_peak.get(ComponentKind.ATTN, 0),
        # per running session: with the cache off, fewer sessions fit the pool at once
        "kv_cells_per_session": stats.kv_used_peak.get(ComponentKind.ATTN, 0) / max(1, stats.max_running),
        "max_running": stats.max_running, "preemptions": stats.preemptions,
        "wall_s": elapsed, "out_tok_per_s": stats.output_tokens / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF path or real model name (default: SmolLM2)")
    parser.add_argument("--system", nargs="+", type=int, default=[512, 1024])
    parser.add_argument("--sessions", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--gen", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=Path("bench/results/prefix-reuse"))
    parser.add_argument("--render-only", action="store_true", help="rewrite summary and plot from results.json")
    args = parser.parse_args()
    if args.render_only:
        saved = json.loads((args.out / "results.json").read_text())
        for r in saved["rows"]:
            r["kv_cells_per_session"] = r["kv_cells_peak"] / max(1, r["max_running"])
        (args.out / "results.json").write_text(json.dumps(saved, indent=2))
        render(saved["rows"], saved["meta"], args.out)
        return

    rows = []
    with Model(resolve_model(args.model), repack=False) as model:
        for s in args.system:
            for n in args.sessions:
                for cache in (False, True):
                    row = trio.run(run, model, s, n, args.gen, cache, args.threads, args.n_ctx)
                    rows.append(row)
                    print(json.dumps(row), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    command = "python bench/prefix_reuse.py " + " ".join(
        [f"--system {' '.join(map(str, args.system))}", f"--sessions {' '.join(map(str, args.sessions))}",
         f"--gen {args.gen}", f"--threads {args.threads}", f"--n-ctx {args.n_ctx}"])
    meta = {"model": str(resolve_model(args.model).name), "gen": args.gen, "threads": args.threads, "n_ctx": args.n_ctx,
            "machine": platform.processor() or platform.machine(), "command": command}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    render(rows, meta, args.out)


def render(rows: list[dict], meta: dict, out: Path) -> None:
    command = meta["command"]
    lines = [
        f"# Prefix reuse: shared system prompt, cache off vs on ({meta['model']}, G={meta['gen']}, "
        f"{meta['threads']} threads, n_ctx {meta['n_ctx']})",
        "", f"Command: `{command}`", "",
        "| system | N | cache | TTFT p50 s | TTFT p99 s | prompt tokens | computed | hit | max running "
        "| KV cells peak | cells per running session | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['system']} | {r['N']} | {'on' if r['cache'] else 'off'} | {r['ttft_p50_s']:.2f} | {r['ttft_p99_s']:.2f} "
            f"| {r['prompt_tokens']} | {r['prefill_tokens']} | {r['prefix_hit_tokens']} | {r['max_running']} "
            f"| {r['kv_cells_peak']} | {r['kv_cells_per_session']:.0f} | {r['wall_s']:.1f} |")
    lines += ["", "Ratios (off / on, same run):", ""]
    for on in (r for r in rows if r["cache"]):
        off = next(r for r in rows if not r["cache"] and r["system"] == on["system"] and r["N"] == on["N"])
        lines.append(f"- system {on['system']}, N={on['N']}: TTFT p50 {off['ttft_p50_s'] / on['ttft_p50_s']:.1f}x lower, "
                     f"p99 {off['ttft_p99_s'] / on['ttft_p99_s']:.1f}x lower; prompt tokens computed "
                     f"{off['prefill_tokens'] / on['prefill_tokens']:.1f}x fewer; KV cells per session "
                     f"{off['kv_cells_per_session'] / on['kv_cells_per_session']:.1f}x fewer")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plot(rows, out / "ttft.png")
    print("\n".join(lines))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, label in zip(axes, ("ttft_p50_s", "prefill_tokens", "kv_cells_per_session"),
                              ("TTFT p50 (s)", "prompt tokens computed", "KV cells per running session (peak)")):
        for s in sorted({r["system"] for r in rows}):
            for cache in (False, True):
                sel = [r for r in rows if r["system"] == s and r["cache"] == cache]
                ax.plot([r["N"] for r in sel], [r[key] for r in sel], "s-" if cache else "o--",
                        label=f"system {s}, cache {'on' if cache else 'off'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sessions (N)")
        ax.set_title(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
