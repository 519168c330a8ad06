"""Cost of batch-invariant mode: llama-batched-bench-style prefill and decode throughput.

For each real model and batch size B, B sequences each prefill a P-token prompt (in ubatches
of n_ubatch) and then decode G tokens together. Both modes run in the same process on the
same build, interleaved round by round, and each figure is the median over rounds, so the
ratio on/off is measured side by side. Writes JSON, a markdown table and a plot.

    python bench/batch_invariance.py [--models smollm2 gemma3 falcon-h1 ...] [--batches 1 8 32] [--rounds 3]

A model is a real model's name, a GGUF path, or a synthetic family at its base size (realistic
dims, Q4_K_M: the MLA, SSM-hybrid and linear-attention-hybrid classes have no small real model
on PyPI).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gate.sweep import isa  # noqa: E402
from skippy.models import real_model, synthetic_model  # noqa: E402
from skippy.models.synth import BASE  # noqa: E402
from skippy.native import Batch, Context, ContextOptions, Model  # noqa: E402


def measure(model: Model, invariant: bool, b: int, prompt: int, gen: int, threads: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) for B sequences of `prompt` tokens generating `gen` each."""
    n_ctx = max(1024, b * (prompt + gen) + 256)
    opts = ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_seq_max=max(b, 1), threads=threads,
                          batch_invariant=invariant)
    rng = np.random.default_rng(b)
    with Context(model, opts) as ctx:
        tokens = rng.integers(1000, 20000, size=(b, prompt)).astype(np.int32)
        flat_tok = tokens.reshape(-1)
        flat_pos = np.tile(np.arange(prompt), b)
        flat_seq = np.repeat(np.arange(b), prompt)
        batch = Batch(512)
        started = time.perf_counter()
        for s in range(0, flat_tok.size, 512):
            e = min(s + 512, flat_tok.size)
            last = np.zeros(e - s, dtype=np.int8)
            last[(flat_pos[s:e] == prompt - 1)] = 1
            ctx.decode(batch.set(flat_tok[s:e], flat_pos[s:e], flat_seq[s:e], last))
        prefill_s = time.perf_counter() - started
        next_tok = rng.integers(1000, 20000, size=b).astype(np.int32)
        started = time.perf_counter()
        for g in range(gen):
            ctx.decode(batch.set(next_tok, np.full(b, prompt + g), np.arange(b), np.ones(b, dtype=np.int8)))
        decode_s = time.perf_counter() - started
    return b * prompt / prefill_s, b * gen / decode_s


def model_path(name: str) -> Path:
    """A GGUF path, a synthetic family at its base size (written once into the cache), or a real model."""
    if Path(name).is_file():
        return Path(name)
    if name in BASE:
        return synthetic_model(name, size="base")
    return real_model(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/batch-invariance"))
    args = parser.parse_args()

    rows = []
    for name in args.models:
        path = model_path(name)
        # the default engine keeps the repacked kernels; invariant mode loads without them
        with Model(path, repack=True) as fast, Model(path, repack=False) as plain:
            for b in args.batches:
                samples: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                for _ in range(args.rounds):
                    for invariant in (False, True):
                        samples[invariant].append(
                            measure(plain if invariant else fast, invariant, b, args.prompt, args.gen, args.threads)
                        )
                row = {"model": name, "B": b}
                for invariant, key in ((False, "off"), (True, "on")):
                    row[f"prefill_{key}"] = statistics.median(s[0] for s in samples[invariant])
                    row[f"decode_{key}"] = statistics.median(s[1] for s in samples[invariant])
                row["prefill_cost_pct"] = 100 * (1 - row["prefill_on"] / row["prefill_off"])
                row["decode_cost_pct"] = 100 * (1 - row["decode_on"] / row["decode_off"])
                rows.append(row)
                print(json.dumps(row), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"prompt": args.prompt, "gen": args.gen, "rounds": args.rounds, "threads": args.threads,
            "machine": platform.processor() or platform.machine(), "isa": isa(),
            "command": "python bench/batch_invariance.py " + " ".join(sys.argv[1:])}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# Batch-invariant mode: cost (P={args.prompt}, G={args.gen}, {args.threads} threads, median of {args.rounds})",
        "",
        f"ISA: {meta['isa']}. Command: `{meta['command']}`.",
        "",
        "| model | B | prefill off tok/s | prefill on tok/s | cost | decode off tok/s | decode on tok/s | cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['B']} | {r['prefill_off']:.0f} | {r['prefill_on']:.0f} | {r['prefill_cost_pct']:+.0f}% "
            f"| {r['decode_off']:.1f} | {r['decode_on']:.1f} | {r['decode_cost_pct']:+.0f}% |"
        )
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    _plot(rows, args.out / "throughput.png")
    print("\n".join(lines))


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, phase in zip(axes, ("prefill", "decode")):
        for name in sorted({r["model"] for r in rows}):
            sel = [r for r in rows if r["model"] == name]
            bs = [r["B"] for r in sel]
            ax.plot(bs, [r[f"{phase}_off"] for r in sel], "o-", label=f"{name} default")
            ax.plot(bs, [r[f"{phase}_on"] for r in sel], "s--", label=f"{name} batch-invariant")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequences in the batch (B)")
        ax.set_ylabel("tokens / s")
        ax.set_title(phase)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
