"""Workloads: length mixes x prefix shapes, as seeded token-id prompts.

Prompts are token ids, not text, so every engine sees exactly the same input of exactly the
intended length whatever its tokenizer front end does with text (both servers take ids on
/v1/completions as they are); ids are drawn from the model's normal (non-control) tokens,
after BOS when the model asks for one. The shared-prefix variant puts one seeded "system
prompt" of `shared_len` ids in front of every request: the prefix-cache win in isolation.
Generation: the same (seed, workload, stream) always gives the same prompts.
"""

from __future__ import annotations

import zlib

import attrs
import numpy as np

# length mix -> (input length key, output length key)
MIXES: dict[str, tuple[str, str]] = {
    "chat": ("short", "short"),  # short-in / short-out
    "rag": ("long", "short"),  # long-in / short-out (summarise, retrieval)
    "gen": ("short", "long"),  # short-in / long-out (generation)
    "long": ("long", "long"),  # long-in / long-out
}
SHARED_SUFFIX = "-shared"


@attrs.frozen
class Lengths:
    """Token lengths of the mixes; `shared_fraction` of the input is the shared system prompt."""

    short_in: int = 128
    long_in: int = 1024
    short_out: int = 64
    long_out: int = 512
    shared_fraction: float = 0.75


@attrs.frozen
class Workload:
    name: str
    input_len: int
    output_len: int
    shared_len: int  # 0: every prompt unique from its first token

    @property
    def shared(self) -> bool:
        return self.shared_len > 0


def workload_names() -> list[str]:
    return [m + s for m in MIXES for s in ("", SHARED_SUFFIX)]


def make_workload(name: str, lengths: Lengths = Lengths()) -> Workload:
    """'chat', 'rag', 'gen', 'long', each optionally with '-shared'."""
    shared = name.endswith(SHARED_SUFFIX)
    mix = name[: -len(SHARED_SUFFIX)] if shared else name
    if mix not in MIXES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(workload_names())}")
    i, o = MIXES[mix]
    n_in = lengths.short_in if i == "short" else lengths.long_in
    n_out = lengths.short_out if o == "short" else lengths.long_out
    shared_len = int(n_in * lengths.shared_fraction) if shared else 0
    return Workload(name, n_in, n_out, max(0, min(shared_len, n_in - 2)))  # >= 1 unique id after BOS


@attrs.frozen
class Vocab:
    """What prompt generation needs of a model: ids safe to use as text, and BOS if it wants one."""

    normal_ids: tuple[int, ...]
    bos: int | None


def _rng(seed: int, *salt: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(s.encode()) for s in salt)])


def make_prompts(w: Workload, vocab: Vocab, count: int, seed: int, stream: str = "measured") -> list[list[int]]:
    """`count` prompts of exactly `w.input_len` ids (BOS included). The system prompt depends on
    the seed and workload only, so warm-up (another `stream`) shares it and measured prompts do not
    repeat warm-up ones."""
    ids = np.asarray(vocab.normal_ids, dtype=np.int64)
    head = [vocab.bos] if vocab.bos is not None else []
    n_body = w.input_len - len(head)
    system = _rng(seed, w.name, "system").choice(ids, size=w.shared_len).tolist()
    rng = _rng(seed, w.name, stream)
    return [head + system + rng.choice(ids, size=n_body - w.shared_len).tolist() for _ in range(count)]
