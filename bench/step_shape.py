"""What a step of a given shape costs: decode rows (one token and one logit row each) and prefill
tokens (no logits but a chunk's last), timed in-process on SmolLM2 with the engine's context settings.

    python bench/step_shape.py [--inv 0|1] [--reps 3] [--out DIR]

The token budget predicts a mixed step's time from the steps the engine has run
(`skippy.scheduling.cost.StepCostModel`, by shape). This probe checks that model against real steps: it
times D decode rows (D sequences with 160 cached tokens each) plus P prompt tokens of a fresh
sequence, for a grid of (D, P) in shuffled order, then feeds the same (shape, seconds) pairs to the
model and reports its error on the mixed steps (D > 0 and P > 0).
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
from skippy.scheduling.cost import StepCostModel, StepShape, attended_kcells

CONTEXT = 160  # cached tokens per decoding sequence (a 128-token prompt and some output)
DECODES = (0, 1, 8, 16, 32)
PREFILLS = (0, 16, 64, 128, 256, 480)


def fill(ctx: Context, rng: np.random.Generator) -> None:
    """The decoding sequences' context: CONTEXT tokens each in sequences 0 .. max(DECODES)-1."""
    batch = Batch(ctx.n_batch)
    for s in range(max(DECODES)):
        ctx.decode(batch.set(rng.integers(1000, 20000, size=CONTEXT), np.arange(CONTEXT), s))


def grid_times(ctx: Context, rng: np.random.Generator, reps: int) -> list[tuple[int, int, float]]:
    batch = Batch(ctx.n_batch)
    fresh = max(DECODES)  # the prompt's sequence
    shapes = [(d, p) for d in DECODES for p in PREFILLS if d + p > 0] * reps
    rng.shuffle(shapes)
    out = []
    for d, p in shapes:
        tok = rng.integers(1000, 20000, size=d + p).astype(np.int32)
        pos = np.concatenate([np.full(d, CONTEXT), np.arange(p)]).astype(np.int32)
        seq = np.concatenate([np.arange(d), np.full(p, fresh)]).astype(np.int32)
        outputs = np.zeros(d + p, dtype=np.int8)
        outputs[:d] = 1
        if p:
            outputs[-1] = 1
        batch.set(tok, pos, seq, outputs)
        t = time.perf_counter()
        ctx.decode(batch)
        out.append((d, p, time.perf_counter() - t))
        for s in range(d):
            ctx.seq_rm(s, CONTEXT, -1)
        ctx.seq_rm(fresh, 0, -1)
    return out


def shape_of(d: int, p: int) -> StepShape:
    """The probe's step as the engine's cost model sees it: D rows over CONTEXT cells, a fresh P-token prompt."""
    return StepShape(d, p, d * (CONTEXT + 1) / 1000.0 + attended_kcells(0, p), int(p > 0))


def model_error(times: list[tuple[int, int, float]]) -> dict:
    """The engine's step-cost model (scheduling.cost) fed every timed step, then asked for the mixed ones."""
    model = StepCostModel()
    for d, p, s in times:
        model.observe(shape_of(d, p), s)
    theta = model.theta()
    mixed = [(d, p, s) for d, p, s in times if d and p]
    rel = [model.seconds(shape_of(d, p)) / s - 1 for d, p, s in mixed]
    return {"fixed_ms": 1e3 * theta[0], "per_row_ms": 1e3 * theta[1], "per_token_ms": 1e3 * theta[2],
            "mixed_rel_error_median": float(np.median(rel)), "mixed_rel_error_min": float(min(rel)),
            "mixed_rel_error_max": float(max(rel))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inv", type=int, default=1, help="batch-invariant kernels (1: skippy's default)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    model = Model(resolve_model("smollm2"), repack=a.inv != 1)  # as the engine loads it
    ctx = Context(model, ContextOptions(n_ctx=16384, n_seq_max=64, threads=2, batch_invariant=a.inv == 1))
    rng = np.random.default_rng(11)
    fill(ctx, rng)
    grid_times(ctx, rng, 1)  # warm-up
    times = grid_times(ctx, rng, a.reps)
    med = {}
    for d, p, s in times:
        med.setdefault((d, p), []).append(s)
    print("D\\P " + " ".join(f"{p:>8}" for p in PREFILLS))
    for d in DECODES:
        print(f"{d:>3} " + " ".join(f"{1e3 * np.median(med[(d, p)]):8.1f}" if (d, p) in med else f"{'-':>8}"
                                    for p in PREFILLS))
    err = model_error(times)
    print(json.dumps(err, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "step_shape.json").write_text(json.dumps(
            {"inv": a.inv, "context": CONTEXT, "times": times, "model": err}, indent=1))


if __name__ == "__main__":
    main()
