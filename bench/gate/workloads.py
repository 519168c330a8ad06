"""Workloads: length mixes x prefix shapes, as seeded token-id prompts.

Prompts are token ids, not text, so every engine sees exactly the same input of exactly the
intended length whatever its tokenizer front end does with text (both servers take ids on
/v1/completions as they are); ids are drawn from the model's normal (non-control) tokens,
after BOS when the model asks for one. The shared-prefix variant puts one seeded "system
prompt" of `shared_len` ids in front of every request: the prefix-cache win in isolation.
Generation: the same (seed, workload, stream) always gives the same prompts.

The bimodal mix is chat with about `doc_share` of its requests a `doc_in`-token document
instead (same output length): the goodput issue's mixed load, where one long prompt must not
make the short ones behind it late. Which requests are documents is seeded too.
"""

from __future__ import annotations

import zlib

import attrs
import numpy as np

# length mix -> (input length key, output length key)
MIXES: dict[str, tuple[str, str]] = {
    "chat": ("short", "short"),  # short-in / short-out
    "rag": ("long", "short"),  # long-in / short-out (summarise, retrieval)
    "rag512": ("mid", "short"),  # the prefill-heavy issue's 512-in variant of rag
    "gen": ("short", "long"),  # short-in / long-out (generation)
    "long": ("long", "long"),  # long-in / long-out
    "bimodal": ("short", "short"),  # chat, with a share of documents (Lengths.doc_in, doc_share)
}
WITH_DOCS = {"bimodal"}
SHARED_SUFFIX = "-shared"


@attrs.frozen
class Lengths:
    """Token lengths of the mixes; `shared_fraction` of the input is the shared system prompt."""

    short_in: int = 128
    long_in: int = 1024
    short_out: int = 64
    long_out: int = 512
    shared_fraction: float = 0.75
    doc_in: int = 2048
    doc_share: float = 0.1
    mid_in: int = 512  # rag512's (last: Lengths is built positionally from the command line)


@attrs.frozen
class Workload:
    name: str
    input_len: int
    output_len: int
    shared_len: int  # 0: every prompt unique from its first token
    doc_len: int = 0  # > 0: about `doc_share` of the prompts are this long instead (the bimodal mix)
    doc_share: float = 0.0

    @property
    def shared(self) -> bool:
        return self.shared_len > 0

    @property
    def max_input_len(self) -> int:
        return max(self.input_len, self.doc_len)


def workload_names() -> list[str]:
    return [m + s for m in MIXES for s in ("", SHARED_SUFFIX)]


def make_workload(name: str, lengths: Lengths = Lengths()) -> Workload:
    """'chat', 'rag', 'rag512', 'gen', 'long', 'bimodal', each optionally with '-shared'."""
    shared = name.endswith(SHARED_SUFFIX)
    mix = name[: -len(SHARED_SUFFIX)] if shared else name
    if mix not in MIXES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(workload_names())}")
    i, o = MIXES[mix]
    n_in = {"short": lengths.short_in, "mid": lengths.mid_in, "long": lengths.long_in}[i]
    n_out = lengths.short_out if o == "short" else lengths.long_out
    shared_len = int(n_in * lengths.shared_fraction) if shared else 0
    docs = (lengths.doc_in, lengths.doc_share) if mix in WITH_DOCS else (0, 0.0)
    return Workload(name, n_in, n_out, max(0, min(shared_len, n_in - 2)), *docs)  # >= 1 unique id after BOS


@attrs.frozen
class Vocab:
    """What prompt generation needs of a model: ids safe to use as text, and BOS if it wants one."""

    normal_ids: tuple[int, ...]
    bos: int | None


def _rng(seed: int, *salt: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(s.encode()) for s in salt)])


def make_prompts(w: Workload, vocab: Vocab, count: int, seed: int, stream: str = "measured") -> list[list[int]]:
    """`count` prompts of exactly `w.input_len` ids (BOS included), or `w.doc_len` for the documents
    of a bimodal mix. The system prompt depends on the seed and workload only, so warm-up (another
    `stream`) shares it and measured prompts do not repeat warm-up ones."""
    ids = np.asarray(vocab.normal_ids, dtype=np.int64)
    head = [vocab.bos] if vocab.bos is not None else []
    system = _rng(seed, w.name, "system").choice(ids, size=w.shared_len).tolist()
    rng = _rng(seed, w.name, stream)
    docs = _rng(seed, w.name, stream, "docs").random(count) < w.doc_share
    lens = [w.doc_len if doc else w.input_len for doc in docs]
    return [head + system + rng.choice(ids, size=n - len(head) - w.shared_len).tolist() for n in lens]
