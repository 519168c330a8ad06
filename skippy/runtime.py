"""What the RuntimeOwner drives: a Runtime protocol, its llama.cpp implementation, and sampling.

The protocol is the seam between scheduler logic and the native library: the real
`ContextRuntime` wraps one Model + Context; `skippy.fake_runtime.FakeRuntime` stands in
for scheduler-logic tests only (anything about llama.cpp behaviour is tested on the real one).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from .kv import Ledger
from .native import Batch, Context, ContextOptions, Model
from .sampling import Sampler


class Runtime(Protocol):
    arch: str
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_vocab: int

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        """One llama_decode; logits rows of the output tokens, valid until the next decode."""

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def ledger(self) -> Ledger: ...

    def abort(self) -> None:
        """Make a running decode return early. Thread-safe."""

    def tokenize(self, text: str) -> np.ndarray: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def close(self) -> None: ...


class ContextRuntime:
    """One llama.cpp context over a model; owns the context, borrows or owns the model."""

    def __init__(self, model: Model, options: ContextOptions, *, own_model: bool = False) -> None:
        self.model = model
        self._own_model = own_model
        self.ctx = Context(model, options)
        self.arch = model.arch
        self.n_ctx, self.n_batch, self.n_seq_max, self.n_vocab = (
            self.ctx.n_ctx, self.ctx.n_batch, self.ctx.n_seq_max, self.ctx.n_vocab,
        )
        self._batch = Batch(self.n_batch)
        self._tok = model.tokenizer

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        return self.ctx.decode(self._batch.set(tokens, positions, seq_ids, outputs))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.ctx.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.ctx.seq_cp(src, dst, p0, p1)

    def ledger(self) -> Ledger:
        return self.ctx.ledger()

    def abort(self) -> None:
        self.ctx.abort()

    # The vocabulary is immutable after load and llama.cpp's vocab calls are read-only,
    # so tokenizing a prompt does not need to wait for the step in flight.
    def tokenize(self, text: str) -> np.ndarray:
        return self._tok.tokenize(text)

    def piece(self, token: int) -> bytes:
        return self._tok.piece(token)

    def is_eog(self, token: int) -> bool:
        return self._tok.is_eog(token)

    def close(self) -> None:
        self.ctx.close()
        if self._own_model:
            self.model.close()


def sample_rows(logits: np.ndarray, samplers: Sequence[Sampler]) -> np.ndarray:
    """One token per logits row: greedy rows in one vectorised argmax, the rest by their own RNG."""
    out = np.empty(len(samplers), dtype=np.int64)
    greedy = np.fromiter((s.params.greedy for s in samplers), dtype=bool, count=len(samplers))
    if greedy.any():
        idx = np.flatnonzero(greedy)
        out[idx] = np.argmax(logits[idx], axis=1)
    for i in np.flatnonzero(~greedy):
        out[i] = samplers[i](logits[i])
    return out
