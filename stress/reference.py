"""The solo greedy reference: one request alone on its own batch-invariant context.

Same construction as tests/parity: the model loaded without repacked weights (the engine's
default batch-invariant load), a one-sequence context with `batch_invariant=True`, and
`skippy._generate.generate_tokens`. The engine is batch-invariant by default, so a greedy
request served among hundreds must produce exactly these tokens.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from skippy._generate import generate_tokens
from skippy.native import Context, ContextOptions, Model
from skippy.sampling import Sampler, SamplingParams
from skippy.scheduling.text import TextAssembler


class SoloReference:
    """Owns a Model and a one-sequence Context; close() (or `with`) frees both."""

    def __init__(self, path: os.PathLike[str] | str, n_ctx: int, threads: int = 1) -> None:
        self.model = Model(path, repack=False)
        try:
            opts = ContextOptions(n_ctx=n_ctx, n_batch=64, n_ubatch=64, n_seq_max=1, threads=threads,
                                  batch_invariant=True)
            self.ctx = Context(self.model, opts)
        except BaseException:
            self.model.close()
            raise

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    def tokens(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """Greedy tokens, up to max_tokens, ending early after an end-of-generation token (kept)."""
        p = np.asarray(prompt, dtype=np.int32)
        return list(generate_tokens(self.ctx, p, max_tokens, Sampler(SamplingParams())))

    def text(self, tokens: Sequence[int]) -> str:
        """The text the engine sends for these tokens: pieces through the same assembler, the
        end-of-generation piece left out."""
        tok = self.model.tokenizer
        asm, parts = TextAssembler(()), []
        for i, t in enumerate(tokens):
            if tok.is_eog(t):
                parts.append(asm.flush())
                break
            parts.append(asm.push(tok.piece(t))[0])
            if i == len(tokens) - 1:
                parts.append(asm.flush())
        return "".join(parts)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> "SoloReference":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
