"""The one model file every engine of a sweep loads, and the vocabulary prompts are drawn from.

Resolved through skippy's own resolver so `skippy serve` and llama-server read the same
bytes: the embedded default (SmolLM2), a real model by name, a path, or a synthetic family
(written once into the cache).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

from .workloads import Vocab

NORMAL_TOKEN = 1  # gguf TokenType.NORMAL


@attrs.frozen
class ModelSpec:
    """How to name the model to `skippy serve` (`--model`/`--family`) and its resolved file."""

    model: str | None
    family: str | None
    path: Path

    @classmethod
    def resolve(cls, model: str | None = None, family: str | None = None) -> ModelSpec:
        from skippy.models import resolve_model

        return cls(model, family, Path(resolve_model(model, family)).resolve())

    def skippy_args(self) -> list[str]:
        if self.family is not None:
            return ["--family", self.family]
        if self.model is not None:
            return ["--model", self.model]
        return []


def read_vocab(path: Path) -> Vocab:
    """Normal token ids and BOS (when the model adds one) from the GGUF's tokenizer keys."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    types_field = fields["tokenizer.ggml.token_type"]
    types = np.concatenate([np.asarray(types_field.parts[i]) for i in types_field.data])
    normal = tuple(int(i) for i in np.flatnonzero(types == NORMAL_TOKEN))
    if not normal:
        raise ValueError(f"{path}: no normal tokens to build prompts from")
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    wants_bos = add_bos is not None and bool(add_bos.contents()) and bos is not None
    return Vocab(normal, int(bos.contents()) if wants_bos else None)  # type: ignore[union-attr]
