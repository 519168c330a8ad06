"""What the RuntimeOwner drives: a Runtime protocol, its llama.cpp implementation, and sampling.

The protocol is the seam between scheduler logic and the native library: the real
`ContextRuntime` wraps one Model + Context; `skippy.testing.FakeRuntime` stands in
for scheduler-logic tests only (anything about llama.cpp behaviour is tested on the real one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol, Sequence

import attrs
import numpy as np

from . import _dry
from .families import KvClass, derive_class
from .kv import Ledger
from .native import Batch, Context, ContextOptions, Model
from .native._source import sha256_file
from .sampling import Sampler
from .scheduling.logprobs import LogitRows, RowLogprobs, compute as compute_logprobs
from .scheduling.prefix import identity_seed

# Context settings that do not change what a KV cell holds (sizes and threading); every other
# ContextOptions field is part of the prefix identity.
_NOT_IN_IDENTITY = frozenset({"n_ctx", "n_batch", "n_ubatch", "n_seq_max", "threads"})
_digests: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """sha256 of a model file, memoised per (path, size, mtime) for this process."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        _digests[key] = sha256_file(path)
    return _digests[key]


@attrs.frozen
class Sampled:
    """One step's outcome on a runtime: a token per output row."""

    tokens: np.ndarray
    t_decode: float  # seconds computing the batch (for a pipeline: until the last stage answered)
    logprobs: RowLogprobs | None = None  # only when the step's rows asked for them


class Runtime(Protocol):
    """What the RuntimeOwner drives. Every runtime implements the step as `decode_sample`:
    one batch in, one sampled token per output row out (a pipeline samples in its last stage)."""

    arch: str
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_vocab: int
    prefix_identity: bytes | None  # seed of the prefix hash chain (same model file and KV settings); None: no cache
    share_exact: bool  # recurrent state: a prefix is reusable only whole (see scheduling.prefix)

    def decode_sample(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                      samplers: Sequence[Sampler]) -> Sampled:
        """One step; on failure no sampler has drawn (its RNG is where it was). A runtime that holds the
        logits also takes `rows=` (scheduling.logprobs.LogitRows, passed only when a request asked for
        logprobs): which output rows are sampled, which score prompt tokens."""

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...

    def share(self, src: int, dst: int, length: int) -> int:
        """Give dst src's first `length` positions if this family can; returns what was shared (0 or length)."""

    def ledger(self) -> Ledger: ...

    def abort(self) -> None:
        """Make a running decode return early. Thread-safe."""

    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    # optional: breaker_table(breakers) -> DRY's restart sequences over this vocabulary
    # (skippy._dry.breaker_table); a runtime without it serves DRY without breakers only

    def close(self) -> None: ...


def decode_then_sample(decode, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                       samplers: Sequence[Sampler], rows: LogitRows | None = None) -> Sampled:
    """The step of a runtime that holds the logits: decode, then sample each output row (with `rows`: the
    sampled ones, then the logprobs asked, from the same raw rows, before the next decode replaces them)."""
    t0 = time.perf_counter()
    logits = decode(tokens, positions, seq_ids, outputs)
    t1 = time.perf_counter()
    if rows is None:
        return Sampled(sample_rows(logits, samplers), t1 - t0)
    sampled = sample_rows(logits[rows.sample], samplers)
    return Sampled(sampled, t1 - t0, compute_logprobs(logits, rows, sampled))


class ContextRuntime:
    """One llama.cpp context over a model; owns the context, borrows or owns the model."""

    def __init__(self, model: Model, options: ContextOptions, *, own_model: bool = False) -> None:
        self.model = model
        self._own_model = own_model
        self.ctx = Context(model, options)
        try:  # the class of the memory llama.cpp built, whatever the architecture's name
            self.kv_class = derive_class(self.ctx.ledger(), arch=model.arch, memory_type=self.ctx.memory_type())
        except BaseException:
            self.ctx.close()
            raise
        self.arch = model.arch
        self.n_ctx, self.n_batch, self.n_seq_max, self.n_vocab = (
            self.ctx.n_ctx, self.ctx.n_batch, self.ctx.n_seq_max, self.ctx.n_vocab,
        )
        self._batch = Batch(self.n_batch)
        self._tok = model.tokenizer
        # per token id, as the worker thread reads them every step: one dict lookup instead of a
        # cffi call and a buffer (the vocabulary is immutable after load; a dict item is atomic)
        self._pieces: dict[int, bytes] = {}
        self._texts: list[bytes] | None = None  # every token's text, for DRY's breaker tables (on first use)
        self._eog: dict[int, bool] = {}
        self.share_exact = self.kv_class.recurrent or self.kv_class is KvClass.ISWA
        # over recurrent memory llama.cpp splits a batch into equal-length ubatches (scheduling.cost.equal_splits)
        self.equal_split = self.kv_class.recurrent
        settings = {k: v for k, v in attrs.asdict(options).items() if k not in _NOT_IN_IDENTITY}
        self.prefix_identity = identity_seed(file_digest(model.path), model.arch, settings)
        self._n_swa = model.n_swa if self.kv_class is KvClass.ISWA else 0

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        return self.ctx.decode(self._batch.set(tokens, positions, seq_ids, outputs))

    def decode_sample(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                      samplers: Sequence[Sampler], rows: LogitRows | None = None) -> Sampled:
        return decode_then_sample(self.decode, tokens, positions, seq_ids, outputs, samplers, rows)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.ctx.seq_rm(seq_id, p0, p1)

    def share(self, src: int, dst: int, length: int) -> int:
        """seq_cp of [0, length) when the cells it needs are really there.

        - dense / MLA: every position of src is a cell; any prefix shares.
        - ISWA: full-attention cells share like dense ones; in the sliding-window cache
          patch 0003 shares only the window behind `length` (shared cells cannot be
          recycled, and that cache holds about a window per sequence). So a holder can
          serve only its own length (exact mode, like a recurrent state), and only while
          its window cells [length - n_swa + 1, length) are still held: the window cache
          recycles a sequence's older cells lazily. Otherwise nothing is shared and the
          prompt is recomputed (sharing only the full-attention part would leave the
          window layers without their past).
        - recurrent / hybrid: llama.cpp copies the whole state (p0/p1 are ignored for it),
          which is the state after src's last token: only a share of all of src is exact.
        """
        end = self.ctx.seq_pos_max(src) + 1  # src holds positions [pos_min, end)
        if length <= 0 or end < length:
            return 0
        if self.share_exact and end != length:
            return 0
        if self._n_swa and self.ctx.seq_pos_min(src) > max(0, length - self._n_swa + 1):
            return 0
        self.ctx.seq_cp(src, dst, 0, length)
        return length

    def ledger(self) -> Ledger:
        return self.ctx.ledger()

    def abort(self) -> None:
        self.ctx.abort()

    # The vocabulary is immutable after load and llama.cpp's vocab calls are read-only,
    # so tokenizing a prompt does not need to wait for the step in flight.
    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray:
        return self._tok.tokenize(text, add_special=add_special)

    def piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._tok.piece(token)
        return piece

    def breaker_table(self, breakers: Sequence[str]) -> dict[int, tuple[tuple[int, ...], ...]]:
        if self._texts is None:
            self._texts = [self._tok.text_of(t) for t in range(self.n_vocab)]
        return _dry.breaker_table(self._texts, lambda b: self._tok.tokenize(b, add_special=False), breakers)

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = self._tok.is_eog(token)
        return eog

    def eog_ids(self) -> np.ndarray:
        """Every end-of-generation id of the vocabulary (what min_tokens holds out), by a scan that
        leaves the per-token cache alone (it would hold the whole vocabulary)."""
        return np.array([t for t in range(self.n_vocab) if self._tok.is_eog(t)], dtype=np.int64)

    def _probe_prompt(self, seq: int, n: int) -> tuple[Any, float]:
        from .scheduling.cost import StepShape, attended_kcells

        tokens = (np.arange(n, dtype=np.int32) * 7 + 1 + seq) % self.n_vocab
        t0 = time.perf_counter()
        self.decode(tokens, np.arange(n, dtype=np.int32), np.full(n, seq, dtype=np.int32),
                    np.r_[np.zeros(n - 1, dtype=np.int8), np.ones(1, dtype=np.int8)])
        return StepShape(0, n, attended_kcells(0, n), 1), time.perf_counter() - t0

    def _probe_decode(self, seqs: list[int], pos: int) -> tuple[Any, float]:
        from .scheduling.cost import StepShape

        k = len(seqs)
        t0 = time.perf_counter()
        self.decode(np.full(k, (pos * 3 + 2) % self.n_vocab, dtype=np.int32), np.full(k, pos, dtype=np.int32),
                    np.array(seqs, dtype=np.int32), np.ones(k, dtype=np.int8))
        return StepShape(k, 0, k * (pos + 1) / 1000.0, 0), time.perf_counter() - t0

    def _probe_mixed(self, seqs: list[int], pos: int, seq: int, n: int) -> tuple[Any, float]:
        """Decode rows beside a fresh prompt of `n` tokens on `seq`: over recurrent memory a ubatch more."""
        from .scheduling.cost import StepShape, attended_kcells

        k = len(seqs)
        self.seq_rm(seq)
        tokens = np.r_[np.full(k, (pos * 3 + 2) % self.n_vocab), (np.arange(n) * 5 + 3) % self.n_vocab].astype(np.int32)
        positions = np.r_[np.full(k, pos), np.arange(n)].astype(np.int32)
        outputs = np.r_[np.ones(k), np.zeros(n - 1), np.ones(1)].astype(np.int8)
        t0 = time.perf_counter()
        self.decode(tokens, positions, np.r_[seqs, np.full(n, seq)].astype(np.int32), outputs)
        return StepShape(k, n, k * (pos + 1) / 1000.0 + attended_kcells(0, n), 1, 1), time.perf_counter() - t0

    def probe_step_costs(self) -> list[tuple[Any, float]]:
        """Time a few steps of known shape on this context before it serves (a prompt, then one-row decodes
        after it, for each of PROBE_PROMPTS; then PROBE_ROWS rows side by side, and over recurrent memory
        rows beside a prompt), and leave the memory as it was: what the step-cost model
        starts from, so the latency targets are this machine's from the first request (scheduling.slo).
        Call it before the engine starts (it decodes on seq 0)."""
        from .native.context import TEST_FAULT_ENV

        samples: list[tuple[Any, float]] = []
        if os.environ.get(TEST_FAULT_ENV):
            return samples  # a test's injected faults count the serving context's decodes: the probe's would move them
        rows = max(1, min(PROBE_ROWS, self.n_seq_max))
        try:
            for n in PROBE_PROMPTS:  # a prompt alone, then one-row decodes after it
                n = min(n, self.n_batch, self.n_ctx // rows - PROBE_DECODES - 1)
                if n < 2:
                    break
                samples.append(self._probe_prompt(0, n))
                for i in range(PROBE_DECODES):
                    samples.append(self._probe_decode([0], n + i))
                self.seq_rm(0)
            if rows > 1:  # decode rows side by side: what one more row costs
                n = min(PROBE_PROMPTS[0], self.n_batch, self.n_ctx // rows - PROBE_DECODES - 1)
                for s in range(rows):
                    samples.append(self._probe_prompt(s, n))
                for i in range(PROBE_DECODES):
                    samples.append(self._probe_decode(list(range(rows)), n + i))
                m = min(n, self.n_batch - rows + 1)
                if self.equal_split and m >= 2 and n + 2 * PROBE_DECODES < self.n_ctx // rows:
                    for i in range(PROBE_DECODES):  # then rows beside a prompt: what a ubatch more costs
                        samples.append(self._probe_mixed(list(range(rows - 1)), n + PROBE_DECODES + i, rows - 1, m))
        finally:
            for s in range(rows):
                self.seq_rm(s)
        return samples

    def close(self) -> None:
        self.ctx.close()
        if self._own_model:
            self.model.close()


PROBE_PROMPTS = (32, 128)  # prompt lengths the probe at open computes, each then decoded PROBE_DECODES times
PROBE_DECODES = 3
PROBE_ROWS = 4  # then this many sequences decode side by side (at most n_seq_max)


def sample_rows(logits: np.ndarray, samplers: Sequence[Sampler]) -> np.ndarray:
    """One token per logits row: greedy rows in one vectorised argmax, the rest by their own RNG."""
    if all(s.greedy for s in samplers):  # argmax over the logits view itself: no copy of (rows x n_vocab) floats
        return logits[: len(samplers)].argmax(axis=1).astype(np.int64, copy=False)
    greedy = np.fromiter((s.greedy for s in samplers), dtype=bool, count=len(samplers))
    out = np.empty(len(samplers), dtype=np.int64)
    if greedy.any():
        idx = np.flatnonzero(greedy)
        out[idx] = np.argmax(logits[idx], axis=1)
    for i in np.flatnonzero(~greedy):
        out[i] = samplers[i](logits[i])
    return out
