"""Single-sequence generation straight on a Context: the `generate` command and the solo reference for parity tests."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from .errors import InvalidInputError
from .native import Batch, Context
from .sampling import Sampler


def generate_tokens(
    ctx: Context,
    prompt: Sequence[int] | np.ndarray,
    max_tokens: int,
    sampler: Sampler | None = None,
    *,
    seq_id: int = 0,
    chunk: int | None = None,
    stop_at_eog: bool = True,
) -> Iterator[int]:
    """Prefill `prompt` on an empty `seq_id` in chunks, then yield up to max_tokens sampled tokens."""
    prompt = np.asarray(prompt, dtype=np.int32)
    if prompt.size == 0:
        raise InvalidInputError("prompt is empty")
    if max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be >= 1, got {max_tokens}")
    if prompt.size + max_tokens > ctx.n_ctx:
        raise InvalidInputError(f"prompt ({prompt.size}) + max_tokens ({max_tokens}) exceed the context ({ctx.n_ctx})")
    sampler = sampler or Sampler()
    tokenizer = ctx.model.tokenizer
    ctx.seq_rm(seq_id)
    step = min(chunk or ctx.n_batch, ctx.n_batch)
    batch = Batch(step)
    logits = None
    for start in range(0, prompt.size, step):
        part = prompt[start : start + step]
        batch.set(part, np.arange(start, start + part.size), seq_id)
        logits = ctx.decode(batch)
    pos = int(prompt.size)
    for _ in range(max_tokens):
        assert logits is not None
        token = sampler(logits[0])
        yield token
        if stop_at_eog and tokenizer.is_eog(token):
            return
        batch.set([token], [pos], seq_id)
        logits = ctx.decode(batch)
        pos += 1
