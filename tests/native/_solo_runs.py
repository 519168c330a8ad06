"""Prompts and their solo greedy runs, the reference the native fault tests compare against."""

from __future__ import annotations

import numpy as np

from skippy._generate import generate_tokens
from skippy.native import Context, ContextOptions, Model


def prompt(i: int, n: int) -> list[int]:
    return [300 + (i * 7 + 3 * k) % 200 for k in range(n)]


def solo(path, prompts_and_max) -> list[list[int]]:
    """Each request alone, greedy, on its own batch-invariant context (as tests/parity does)."""
    with Model(path, repack=False) as model:
        opts = ContextOptions(n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=1, threads=1, batch_invariant=True)
        with Context(model, opts) as ctx:
            return [list(generate_tokens(ctx, np.array(p, dtype=np.int32), m)) for p, m in prompts_and_max]
