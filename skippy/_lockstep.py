"""A tiny greedy lock-step driver over one Context: the scenarios of the batch-invariance
self-check (skippy.check) and of the invariance tests.

Every sequence records the logits row it sampled each token from, so a scenario can be
compared bit for bit with the same prompt run alone.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from skippy.native import Batch, Context


@attrs.define
class Seq:
    prompt: np.ndarray
    seq_id: int
    arrival: int = 0  # step at which it starts
    chunk: int = 10**9  # prefill chunk size
    start: int = 0  # first prompt position to prefill (after a shared prefix)
    fed: int = 0
    tokens: list[int] = attrs.Factory(list)
    rows: list[np.ndarray] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self.fed = self.start

    @property
    def prefilling(self) -> bool:
        return self.fed < self.prompt.size


@attrs.frozen
class Result:
    tokens: list[int]
    rows: np.ndarray  # (n_tokens, n_vocab): the logits each token was sampled from


def run(
    ctx: Context,
    seqs: list[Seq],
    max_tokens: int,
    before_step: Callable[[int], None] | None = None,
) -> list[Result]:
    """Advance all sequences together: prefill chunks and decode tokens share each batch."""
    batch = Batch(ctx.n_batch)
    step = 0
    while any(len(s.tokens) < max_tokens for s in seqs):
        if before_step is not None:
            before_step(step)
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        outputs: list[int] = []
        owners: list[Seq] = []
        for s in seqs:
            if step < s.arrival or len(s.tokens) >= max_tokens:
                continue
            if s.prefilling:
                part = s.prompt[s.fed : s.fed + s.chunk]
                tokens += part.tolist()
                positions += range(s.fed, s.fed + part.size)
                seq_ids += [s.seq_id] * part.size
                s.fed += part.size
                done = not s.prefilling
                outputs += [0] * (part.size - 1) + [int(done)]
                if done:
                    owners.append(s)
            else:
                tokens.append(s.tokens[-1])
                positions.append(s.prompt.size + len(s.tokens) - 1)
                seq_ids.append(s.seq_id)
                outputs.append(1)
                owners.append(s)
        step += 1
        if not tokens:
            continue
        logits = ctx.decode(batch.set(tokens, positions, seq_ids, outputs))
        for row, s in zip(logits, owners):
            s.rows.append(row.copy())
            s.tokens.append(int(np.argmax(row)))
    return [Result(s.tokens, np.array(s.rows)) for s in seqs]


def alone(ctx: Context, prompt: np.ndarray, max_tokens: int, chunk: int | None = None) -> Result:
    """The reference: one sequence on an empty context, its prompt prefilled in one go."""
    ctx.clear()
    return run(ctx, [Seq(prompt, 0, chunk=chunk or prompt.size)], max_tokens)[0]
