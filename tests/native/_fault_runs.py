"""What the native fault tests share: prompts, their solo greedy runs (the reference), and a load
of concurrent requests through an engine."""

from __future__ import annotations

import numpy as np
import trio

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


async def run_load(engine, specs) -> tuple[dict[int, int], list[list]]:
    """Every (prompt, max_tokens) spec submitted at once; (spec index -> request id, each spec's events)."""
    ids: dict[int, int] = {}
    out: list[list] = [[] for _ in specs]

    async def one(i: int) -> None:
        stream = engine.generate(specs[i][0], max_tokens=specs[i][1])
        ids[i] = stream.request.id
        async for event in stream:
            out[i].append(event)

    async with trio.open_nursery() as nursery:
        for i in range(len(specs)):
            nursery.start_soon(one, i)
    return ids, out
