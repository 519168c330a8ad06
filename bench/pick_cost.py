"""What one sampled pick costs on real logits: SmolLM2's 49152-id rows, the sampling settings clients send.

    python bench/pick_cost.py [--rows 64] [--draws 10] [--out DIR]

Two sets of rows: the logits at the first positions of this repository's README (text), and at
the positions of a prompt of random ids from 1000-20000 (what the gate's workloads send: flatter
distributions, so a top-p cut lies further down the order). Each row is picked from `--draws` times with uniform draws; the pick runs between two
decodes of its sequence (the next decode needs the token), so its time adds to every token's.
Writes pick_cost.json and prints a table (microseconds per pick).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from skippy.models import resolve_model
from skippy.native.batch import Batch
from skippy.native.context import Context, ContextOptions
from skippy.native.model import Model
from skippy.sampling import SamplingParams, pick

SETTINGS = {
    "temperature 1 (the OpenAI default)": SamplingParams(temperature=1.0),
    "temperature 0.7": SamplingParams(temperature=0.7),
    "temperature 1, top_p 0.95": SamplingParams(temperature=1.0, top_p=0.95),
    "llama-server's defaults (0.8, top_k 40, top_p 0.95, min_p 0.05)":
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
}


def real_rows(n_rows: int) -> dict[str, np.ndarray]:
    model = Model(resolve_model("smollm2"))
    ctx = Context(model, ContextOptions(n_ctx=2048, threads=2))
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    prompts = {"README text": model.tokenizer.tokenize(text)[:n_rows],
               "random ids": np.random.default_rng(0).integers(1000, 20000, size=n_rows).astype(np.int32)}
    rows = {}
    for name, ids in prompts.items():
        ctx.seq_rm(0, 0, -1)
        rows[name] = np.array(ctx.decode(Batch(512).set(ids, np.arange(ids.size), 0, np.ones(ids.size, np.int8))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    sources = real_rows(a.rows)
    rng = np.random.default_rng(0)
    out: dict[str, dict] = {}
    print("| rows | setting | mean us | p50 us | p99 us |\n|---|---|---|---|---|")
    for source, rows in sources.items():
        for name, params in SETTINGS.items():
            ts = []
            for row in rows:
                for u in rng.random(a.draws):
                    t = time.perf_counter()
                    pick(row, params, float(u))
                    ts.append(time.perf_counter() - t)
            us = np.array(ts) * 1e6
            out.setdefault(source, {})[name] = {"mean_us": float(us.mean()), "p50_us": float(np.median(us)),
                                                "p99_us": float(np.percentile(us, 99))}
            print(f"| {source} | {name} | {us.mean():.0f} | {np.median(us):.0f} | {np.percentile(us, 99):.0f} |")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "pick_cost.json").write_text(json.dumps({"rows": a.rows, "vocab": int(rows.shape[1]),
                                                          "draws": a.draws, "settings": out}, indent=1))


if __name__ == "__main__":
    main()
