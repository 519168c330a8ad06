"""Attention over one shared KV pool: the pinned llama.cpp stock vs with our patches, unified
KV vs split (one stream per sequence), through llama-batched-bench, side by side in one run.

B sequences prefill `--npp` tokens and decode `--ntg` each, flash attention on, the same model
and threads for every configuration. With `--rounds R` every configuration runs R times, the
configurations interleaved and their order rotated each round: this box drifts by 20-30% over
minutes (one configuration once ran 25% slow for its whole segment), so a table is the median
over rounds and each ratio the median of its per-round ratios. Writes results.json, summary.md
(the table and the ratios issues #10 and #17 ask for) and decode.png.

    python bench/attention_pool.py [--models smollm2 gemma3] [--batches 1 8 32 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gate.batched import parse_jsonl  # noqa: E402
from skippy.models import real_model  # noqa: E402
from skippy.native import ensure_built, ensure_stock_tools  # noqa: E402

BUILDS = ("stock", "patched")
MODES = ("unified", "split")


def argv(tool: Path, model: Path, mode: str, batches: Sequence[int], npp: int, ntg: int, threads: int,
         n_ctx: int | None = None) -> list[str]:
    # room for every sequence of the largest batch; split mode gives each stream n_ctx / max(B)
    n_ctx = n_ctx or max(batches) * (npp + ntg + 64)
    # llama.cpp's logger drops lines queued at exit: a last sacrificial run of one sequence
    # keeps the process alive while the real lines are written (see bench/gate/batched.py)
    plan = [*batches, 1]
    return [str(tool), "-m", str(model), "-c", str(n_ctx), "-b", "2048", "-ub", "512", "-t", str(threads),
            "-tb", str(threads), "-fa", "on", "-kvu" if mode == "unified" else "-no-kvu",
            "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, plan)), "--output-format", "jsonl"]


def run_config(tool: Path, model: Path, mode: str, batches: Sequence[int], npp: int, ntg: int, threads: int,
               log: Path, attempts: int = 3, n_ctx: int | None = None) -> dict[int, dict[str, Any]]:
    """Rows by batch size; sizes whose line was lost are run again."""
    rows: dict[int, dict[str, Any]] = {}
    missing = list(batches)
    with open(log, "a") as fh:
        for _ in range(attempts):
            cmd = argv(tool, model, mode, missing, npp, ntg, threads, n_ctx)
            fh.write("$ " + " ".join(cmd) + "\n")
            done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  env={"LD_LIBRARY_PATH": str(tool.parent), "PATH": "/usr/bin:/bin"})
            fh.write(done.stdout + done.stderr)
            for r in parse_jsonl(done.stdout + "\n" + done.stderr):
                if int(r["pl"]) in missing and int(r["pl"]) not in rows:
                    rows[int(r["pl"])] = r
            missing = [b for b in batches if b not in rows]
            if not missing or done.returncode != 0:
                break
    if missing:
        raise RuntimeError(f"{tool} {mode}: no result for B={missing}; see {log}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--npp", type=int, default=128)
    parser.add_argument("--ntg", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--builds", nargs="+", default=list(BUILDS), choices=BUILDS)
    parser.add_argument("--out", type=Path, default=Path("bench/results/attention-pool"))
    parser.add_argument("--render-only", action="store_true", help="rewrite summary and plot from results.json")
    args = parser.parse_args()
    if args.render_only:
        saved = json.loads((args.out / "results.json").read_text())
        render(saved["rows"], saved["meta"], args.out)
        return

    tools = {"patched": ensure_built(tools=True).tool("llama-batched-bench")}
    if "stock" in args.builds:
        tools["stock"] = ensure_stock_tools().tool("llama-batched-bench")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "batched-bench.log"
    log.write_text("")
    rows = []
    started = time.time()
    configs = [(mode, build) for mode in MODES for build in args.builds]
    for name in args.models:
        model = real_model(name)
        for k in range(args.rounds):
            for b in args.batches:  # one batch size per process: each pair is measured seconds apart
                for mode, build in configs[k % len(configs):] + configs[:k % len(configs)]:
                    print(f"{name} round {k} B={b} {build} {mode} ...", flush=True)
                    r = run_config(tools[build], model, mode, [b], args.npp, args.ntg, args.threads, log,
                                   n_ctx=max(args.batches) * (args.npp + args.ntg + 64))[b]
                    rows.append({"model": name, "build": build, "mode": mode, "B": b, "round": k,
                                 "pp_tok_s": float(r["speed_pp"]), "tg_tok_s": float(r["speed_tg"]),
                                 "t_tg_s": float(r["t_tg"]), "t_pp_s": float(r["t_pp"])})
                    print(json.dumps(rows[-1]), flush=True)
    command = "python bench/attention_pool.py " + " ".join(
        [f"--models {' '.join(args.models)}", f"--batches {' '.join(map(str, args.batches))}",
         f"--npp {args.npp}", f"--ntg {args.ntg}", f"--threads {args.threads}", f"--rounds {args.rounds}",
         f"--builds {' '.join(args.builds)}"])
    meta = {"command": command, "npp": args.npp, "ntg": args.ntg, "threads": args.threads, "rounds": args.rounds,
            "machine": platform.processor() or platform.machine(), "cpu_flags": _cpu_flags(),
            "wall_s": round(time.time() - started, 1)}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    render(rows, meta, args.out)


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(f for f in flags if f.startswith(("avx", "fma", "f16c")))


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _tg(rows: list[dict], **key: Any) -> dict[int, float]:
    """Decode tok/s by round for one configuration."""
    return {r.get("round", 0): r["tg_tok_s"] for r in rows if all(r[k] == v for k, v in key.items())}


def render(rows: list[dict], meta: dict, out: Path) -> None:
    rounds = meta.get("rounds", 1)
    builds = [b for b in BUILDS if any(r["build"] == b for r in rows)]
    cols = [(bu, m) for bu in builds for m in reversed(MODES)]
    lines = [
        f"# Attention over one shared pool: {' vs '.join(builds)}, unified vs split (PP {meta['npp']}, "
        f"TG {meta['ntg']}, {meta['threads']} threads, flash attention on)",
        "", f"Command: `{meta['command']}`  ", f"CPU flags: {' '.join(meta['cpu_flags'])}", "",
        f"Decode tok/s (S_TG) from llama-batched-bench, median of {rounds} interleaved round(s); a ratio is the "
        "median of its per-round ratios (each pair measured back to back).", "",
        "| model | B | " + " | ".join(f"{bu} {m}" for bu, m in cols) + " | patched unified / patched split "
        "(per round) | patched unified / stock split |",
        "|---|---|" + "---|" * len(cols) + "---|---|",
    ]
    goal = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for b in sorted({r["B"] for r in rows if r["model"] == model}):
            tg = {c: _tg(rows, model=model, B=b, build=c[0], mode=c[1]) for c in cols}
            uni, split = tg[("patched", "unified")], tg[("patched", "split")]
            per_round = [uni[k] / split[k] for k in sorted(uni) if k in split]
            vs_split = _median(per_round)
            stock = tg.get(("stock", "split"), {})
            vs_stock = _median([uni[k] / stock[k] for k in sorted(uni) if k in stock])
            lines.append(f"| {model} | {b} | " + " | ".join(f"{_median(list(tg[c].values())):.1f}" for c in cols)
                         + f" | {vs_split:.2f} ({' '.join(f'{x:.2f}' for x in per_round)}) | {vs_stock:.2f} |")
            if b in (32, 64):
                goal.append((model, b, vs_split))
    lines += ["", "Goal (issue #17): patched unified decode >= 0.97x patched split at B=32 and B=64.", ""]
    for model, b, vs_split in goal:
        lines.append(f"- {model} B={b}: unified/split {vs_split:.2f}: {'met' if vs_split >= 0.97 else 'NOT met'}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plot(rows, out / "decode.png")
    print("\n".join(lines))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for build in [b for b in BUILDS if any(r["build"] == b for r in rows)]:
            for mode in MODES:
                sizes = sorted({r["B"] for r in rows if r["model"] == model})
                pts = [(b, _median(list(_tg(rows, model=model, B=b, build=build, mode=mode).values())))
                       for b in sizes]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        linestyle="-" if build == "patched" else "--", label=f"{build} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("B (sequences decoding together)")
        ax.set_ylabel("decode tok/s")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
