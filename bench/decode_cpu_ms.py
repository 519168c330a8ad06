"""CPU milliseconds per decoded token for one sequence (B=1, 1 thread), invariant vs default.

The quick A/B behind patch 0009's header: CPU time (time.process_time) rather than wall time,
so a busy 2-core box still gives usable ratios. Loads the model without and with repacked
weights; prints the median of 3 per mode.

    python bench/decode_cpu_ms.py MODEL.gguf [TOKENS]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from skippy.native import Batch, Context, ContextOptions, Model


def ms_per_token(model: Model, invariant: bool, gen: int, prompt: int = 64) -> float:
    opts = ContextOptions(n_ctx=1024, n_batch=512, n_ubatch=512, n_seq_max=1, threads=1, batch_invariant=invariant)
    with Context(model, opts) as ctx:
        b = Batch(512)
        last = np.zeros(prompt, dtype=np.int8)
        last[-1] = 1
        ctx.decode(b.set(np.arange(1000, 1000 + prompt, dtype=np.int32), np.arange(prompt), np.zeros(prompt, np.int32), last))
        started = time.process_time()
        for g in range(gen):
            ctx.decode(b.set(np.array([1234], np.int32), np.array([prompt + g]), np.array([0]), np.ones(1, np.int8)))
        return (time.process_time() - started) / gen * 1000


def main() -> None:
    path, gen = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 32
    results: dict[tuple[bool, bool], list[float]] = {}
    for repack in (False, True):
        with Model(path, repack=repack) as model:
            for _ in range(3):
                for invariant in (False, True):
                    if not (invariant and repack):  # invariant mode loads without repacked weights
                        results.setdefault((repack, invariant), []).append(ms_per_token(model, invariant, gen))
    for (repack, invariant), v in results.items():
        print(f"repack={repack} invariant={invariant}: {statistics.median(v):.2f} ms/token {['%.2f' % x for x in v]}")


if __name__ == "__main__":
    main()
