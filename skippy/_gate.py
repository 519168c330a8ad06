"""`skippy gate`: a CI-sized cutover gate for the user's model on the user's machine.

Why in the package and not bench/: the verdict is for a user's GGUF on a user's box, and bench/
ships only with a checkout (its full harness, `python -m bench.gate matrix`, also needs
llama-server and hours). This gate drives the embedded engine twice per round, batched and
single-lane (n_seq_max 1, the engine before cutover), engines interleaved, with the rows of the
full gate that a few minutes can measure:

- exactness: the batch-invariance self-check (skippy.check) finds every sequence identical;
- N=1 no regression: batched out tok/s >= 0.95x single-lane alone;
- throughput at N: batched >= min(2, 0.9 x H) x single-lane, H being this hardware's batching
  headroom, measured on the native layer with no scheduler (B sequences decoded in lockstep over
  one alone: the gate's H rule, with our own lockstep loop in place of llama-batched-bench);
- no failed request.

Goodput under Poisson load and the overload row stay with the full matrix (they need minutes
per rate); the verdict says which rows it judged.
"""

from __future__ import annotations

import datetime as dt
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import trio

from .cutover import GATE_CLASSES, GateVerdict, hardware_here

N1_TOLERANCE = 0.95
HEADROOM_SHARE = 0.9
MAX_RATIO = 2.0


def headroom(model_path: Path, sessions: int, max_tokens: int, threads: int, prompt_len: int = 32) -> float:
    """Aggregate tok/s of `sessions` sequences decoded together over one alone, on the native layer."""
    from ._lockstep import Seq, run
    from .native import Context, ContextOptions, Model

    rng = np.random.default_rng(0)
    with Model(model_path, repack=False) as model:
        low, high = min(1000, model.n_vocab // 2), min(20000, model.n_vocab)
        prompts = [rng.integers(low, high, size=prompt_len).astype(np.int32) for _ in range(sessions)]
        cells = (sessions + 1) * (prompt_len + max_tokens)
        opts = ContextOptions(n_ctx=-(-cells // 256) * 256, n_seq_max=sessions, n_batch=512, n_ubatch=512,
                              threads=threads, batch_invariant=True)
        with Context(model, opts) as ctx:
            def rate(group: list[np.ndarray]) -> float:
                ctx.clear()
                started = time.perf_counter()
                run(ctx, [Seq(p, i) for i, p in enumerate(group)], max_tokens)
                return len(group) * max_tokens / (time.perf_counter() - started)

            rate(prompts[:1])  # warm-up
            return rate(prompts) / rate(prompts[:1])


async def _rate(model_path: Path, sessions: int, max_tokens: int, threads: int, single_lane: bool) -> dict[str, Any]:
    from .demo import run_demo

    config: dict[str, Any] = {"threads": threads, "n_ctx": 4096}
    if single_lane:
        config["n_seq_max"] = 1
    return await run_demo(model_path, sessions=sessions, max_tokens=max_tokens, stagger_steps=0, progress=False,
                          **config)


def run_gate(model_path: Path, arch: str, *, threads: int = 2, sessions: int = 8, max_tokens: int = 48,
             rounds: int = 2, argv: list[str] | None = None, say: Callable[[str], None] = lambda _: None,
             ) -> GateVerdict:
    from .check import build_id, check_file, file_sha256, store

    say("exactness: the batch-invariance self-check")
    check = check_file(model_path, {"threads": threads})
    store(check)
    say(f"hardware headroom H at B={sessions}")
    h = headroom(model_path, sessions, max_tokens, threads)
    rates: dict[tuple[str, int], list[float]] = {}
    failed = 0
    for r in range(rounds):
        for n in (1, sessions):
            for name in ("batched", "single-lane"):
                say(f"round {r + 1}/{rounds}: {name}, {n} session(s) x {max_tokens} tokens")
                got = trio.run(_rate, model_path, n, max_tokens, threads, name == "single-lane")
                rates.setdefault((name, n), []).append(got["out_tok_per_s"])
                failed += got["failed"]
    med = {k: statistics.median(v) for k, v in rates.items()}
    need = min(MAX_RATIO, HEADROOM_SHARE * h)
    checks = [
        (check.identical, f"exactness             {'identical' if check.identical else 'NOT identical'} to solo "
                          f"runs ({len(check.verdicts)} scenarios)"),
        (med["batched", 1] >= N1_TOLERANCE * med["single-lane", 1],
         f"N=1 no regression     batched {med['batched', 1]:.1f} vs single-lane {med['single-lane', 1]:.1f} "
         f"tok/s, need >= {N1_TOLERANCE} x"),
        (med["batched", sessions] >= need * med["single-lane", sessions],
         f"throughput@N={sessions:<3}      batched {med['batched', sessions]:.1f} vs single-lane "
         f"{med['single-lane', sessions]:.1f} tok/s, need >= min({MAX_RATIO:g}, {HEADROOM_SHARE} x H={h:.2f}) = "
         f"{need:.2f} x"),
        (failed == 0, f"no failed requests    {failed} failed"),
    ]
    lines = tuple(f"{'PASS' if ok else 'FAIL'}  {text}" for ok, text in checks)
    return GateVerdict(
        model_sha256=file_sha256(model_path), model=model_path.name, arch=arch,
        gate_class=GATE_CLASSES.get(arch, "unlisted"), hardware=hardware_here(), threads=threads, build=build_id(),
        passed=all(ok for ok, _ in checks), checks=lines,
        command=shlex.join(["skippy", *(sys.argv[1:] if argv is None else argv)]),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
