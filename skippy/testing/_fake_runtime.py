"""A deterministic stand-in Runtime for scheduler-logic tests (never for llama.cpp behaviour).

Each sequence's next token is a hash of its whole token history, so a sequence
recomputed after preemption continues exactly as it would have without it, and a
duplicated or dropped token changes everything after it. Memory is a cell pool with
the same accounting as the real ledger (one attention cell per token, shared by every
sequence that holds it, freed when the last one lets go; optionally one recurrent state
per sequence, shared after a copy until the next decode); `hidden` cells simulate
memory taken by someone else. With `prefix=True` it supports prefix sharing with the
same family rules as the real runtime (`share`): any prefix for attention, only a
whole sequence when recurrent.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Sequence

import numpy as np

from ..errors import InvalidBatchError, NoKvSlotError
from ..kv import ComponentKind, Ledger, MemoryComponent
from ..runtime import Sampled, decode_then_sample
from ..sampling import Sampler

_MOD = (1 << 61) - 1


def next_hash(h: int, token: int) -> int:
    return (h * 1_000_003 + int(token) + 1) % _MOD


def chain(tokens: Sequence[int]) -> list[int]:
    """What the fake's cells hold for these tokens: the rolling hash at every position."""
    out, h = [], 0
    for t in tokens:
        h = next_hash(h, int(t))
        out.append(h)
    return out


def default_step_cost(decode_rows: int, prompt_tokens: int) -> float:
    """A CPU's shape, scaled down: a fixed cost, then about the same per decode row and per prompt token."""
    return 1e-3 + 2.5e-4 * (decode_rows + prompt_tokens)


class FakeClock:
    """Seconds that pass only when told (by the fake's decodes, or a test)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class FakeRuntime:
    arch = "fake"

    def __init__(
        self,
        n_ctx: int = 1024,
        n_batch: int = 64,
        n_seq_max: int = 8,
        n_vocab: int = 64,
        *,
        recurrent: bool = False,
        eog_every: int = 0,  # 0: never end early; k: tokens whose hash % k == 0 end the generation
        prefix: bool = False,
        step_cost: "Callable[[int, int], float] | None" = None,
        split_cost: float = 0.0,
    ) -> None:
        self.n_ctx, self.n_batch, self.n_seq_max, self.n_vocab = n_ctx, n_batch, n_seq_max, n_vocab
        self.recurrent = recurrent
        self.eog_every = eog_every
        self.prefix_identity: bytes | None = b"fake-runtime" if prefix else None
        self.share_exact = recurrent
        # recurrent: a batch goes in equal-length ubatches, as llama.cpp splits it, each one more costing
        # `split_cost` seconds on top of step_cost (scheduling.cost.equal_splits)
        self.equal_split = recurrent
        self.split_cost = split_cost
        self.hidden = 0
        # Simulated time (scheduling.slo): each decode takes step_cost(decode rows, prompt tokens) seconds of
        # `clock`, which moves only by decodes (and FakeClock.advance), and reports it as its t_decode
        self.step_cost = step_cost if step_cost is not None else default_step_cost
        self.clock = FakeClock()
        self.seqs: dict[int, list[int]] = {}  # seq id -> its cell per position
        self.cell_hash: dict[int, int] = {}  # cell -> rolling hash of the tokens up to it
        self.owners: dict[int, set[int]] = {}  # cell -> sequences holding it
        self.state: dict[int, int] = {}  # seq id -> recurrent state id (shared after a copy)
        self._ids = itertools.count()
        self.decodes = 0
        self.tokens_decoded = 0
        self.shares = 0
        self.aborted = False
        self.closed = False
        self.fail_next: Exception | None = None
        self.on_decode: Callable[[], None] | None = None  # runs in the worker thread, e.g. to block
        self._abort = threading.Event()
        self.lock = threading.Lock()  # held by decode: a test that takes memory (`hidden`) takes it too

    # -- the model ------------------------------------------------------------

    def token_for(self, h: int) -> int:
        if self.eog_every and h % self.eog_every == 0:
            return 0
        return 1 + h % (self.n_vocab - 1)

    def solo(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """What a sequence generates alone, greedy: the reference for parity of scheduling."""
        h = 0
        for t in prompt:
            h = next_hash(h, t)
        out = []
        for _ in range(max_tokens):
            t = self.token_for(h)
            out.append(t)
            if t == 0:
                break
            h = next_hash(h, t)
        return out

    def hashes(self, seq_id: int) -> list[int]:
        """The rolling hash at every position of a sequence: what its cells hold."""
        return [self.cell_hash[c] for c in self.seqs.get(seq_id, ())]

    # -- Runtime ----------------------------------------------------------------

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        if self.on_decode is not None:
            self.on_decode()
        if self._abort.is_set():
            self._abort.clear()
            from ..errors import DecodeAbortedError

            raise DecodeAbortedError(2, "decode aborted")
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        with self.lock:
            return self._decode(tokens, positions, seq_ids, outputs)

    def probe_step_costs(self) -> list:
        """What ContextRuntime's probe at open would time, from `step_cost` (nothing is decoded: the fake's
        memory and decode counts stay as they are)."""
        from ..runtime import PROBE_DECODES, PROBE_PROMPTS, PROBE_ROWS
        from ..scheduling.cost import StepShape, attended_kcells

        out = []
        for n in PROBE_PROMPTS:
            n = min(n, self.n_batch)
            out.append((StepShape(0, n, attended_kcells(0, n), 1), float(self.step_cost(1, n - 1))))
            out += [(StepShape(1, 0, (n + i + 1) / 1000.0, 0), float(self.step_cost(1, 0))) for i in range(PROBE_DECODES)]
        rows = min(PROBE_ROWS, self.n_seq_max)
        if rows > 1:
            n = min(PROBE_PROMPTS[0], self.n_batch)
            out += [(StepShape(0, n, attended_kcells(0, n), 1), float(self.step_cost(1, n - 1)))] * rows
            out += [(StepShape(rows, 0, rows * (n + i + 1) / 1000.0, 0), float(self.step_cost(rows, 0)))
                    for i in range(PROBE_DECODES)]
            if self.equal_split:  # rows beside a prompt, as ContextRuntime's probe does over recurrent memory
                m = min(n, self.n_batch - rows + 1)
                out += [(StepShape(rows - 1, m, (rows - 1) * (n + i + 1) / 1000.0 + attended_kcells(0, m), 1, 1),
                         float(self.step_cost(rows, m - 1)) + self.split_cost) for i in range(PROBE_DECODES)]
        return out

    def decode_sample(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                      samplers: Sequence[Sampler], rows=None) -> Sampled:
        sampled = decode_then_sample(self.decode, tokens, positions, seq_ids, outputs, samplers, rows)
        rows_out = int(np.count_nonzero(outputs))
        seconds = float(self.step_cost(rows_out, int(tokens.size) - rows_out))
        if self.recurrent and self.split_cost:
            from ..scheduling.cost import equal_splits

            seconds += self.split_cost * equal_splits(np.unique(seq_ids, return_counts=True)[1].tolist())
        self.clock.advance(seconds)
        return Sampled(sampled.tokens, seconds, sampled.logprobs)

    def _decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        n = int(tokens.size)
        if n == 0 or n > self.n_batch:
            raise InvalidBatchError(f"{n} tokens for n_batch {self.n_batch}")
        batch_seqs = {int(s) for s in seq_ids}
        # a sequence that is new, or whose state another holds, needs a state of its own
        new_states = {s for s in batch_seqs if s not in self.state or self._state_shared(s)}
        if self._used() + n > self.n_ctx or (self.recurrent and self._slots() + len(new_states) > self.n_seq_max):
            raise NoKvSlotError(1, "no KV slot for the batch (memory is full)")
        expect: dict[int, int] = {}
        for s, p in zip(seq_ids.tolist(), positions.tolist()):
            want = expect.get(s, len(self.seqs.get(s, ())))
            if p != want:
                raise InvalidBatchError(f"seq {s} continues at position {p}, but its memory ends at {want - 1}")
            expect[s] = p + 1
        for s in new_states:
            self.state[s] = next(self._ids)
        rows = []
        for t, s, o in zip(tokens.tolist(), seq_ids.tolist(), outputs.tolist()):
            cells = self.seqs.setdefault(s, [])
            h = next_hash(self.cell_hash[cells[-1]] if cells else 0, t)
            cell = next(self._ids)
            self.cell_hash[cell], self.owners[cell] = h, {s}
            cells.append(cell)
            if o:
                row = np.zeros(self.n_vocab, dtype=np.float32)
                row[self.token_for(h)] = 1.0
                rows.append(row)
        self.decodes += 1
        self.tokens_decoded += n
        return np.stack(rows) if rows else np.empty((0, self.n_vocab), dtype=np.float32)

    def _state_shared(self, seq_id: int) -> bool:
        st = self.state.get(seq_id)
        return st is not None and sum(1 for v in self.state.values() if v == st) > 1

    def _used(self) -> int:
        return len(self.owners) + self.hidden

    def _slots(self) -> int:
        return len(set(self.state.values())) if self.recurrent else 0

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        if seq_id < 0:
            for s in list(self.seqs):
                self.seq_rm(s)
            return True
        cells = self.seqs.get(seq_id, [])
        p0 = 0 if p0 < 0 else p0
        p1 = len(cells) if p1 < 0 else p1
        if p1 < len(cells) and p0 < p1:
            return False  # only tails can be cut in this model
        for c in cells[p0:]:
            holders = self.owners[c]
            holders.discard(seq_id)
            if not holders:
                del self.owners[c], self.cell_hash[c]
        del cells[p0:]
        if not cells:
            self.seqs.pop(seq_id, None)
            self.state.pop(seq_id, None)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        assert p0 <= 0, "only prefixes are shared"
        self.seq_rm(dst)
        cells = self.seqs.get(src, [])
        take = cells[: len(cells) if p1 < 0 else p1]
        if not take:
            return
        self.seqs[dst] = list(take)
        for c in take:
            self.owners[c].add(dst)
        if src in self.state:
            self.state[dst] = self.state[src]

    def share(self, src: int, dst: int, length: int) -> int:
        """The real runtime's rules: any prefix of attention cells; a recurrent state only whole."""
        end = len(self.seqs.get(src, ()))
        if length <= 0 or end < length or (self.share_exact and end != length):
            return 0
        self.seq_cp(src, dst, 0, length)
        self.shares += 1
        return length

    def ledger(self) -> Ledger:
        comps = [MemoryComponent(ComponentKind.ATTN, self.n_ctx, self._used(), self.n_ctx * 64)]
        if self.recurrent:
            comps.append(MemoryComponent(ComponentKind.RECURRENT, self.n_seq_max, self._slots(), self.n_seq_max * 1024))
        return Ledger(tuple(comps))

    def abort(self) -> None:
        self.aborted = True
        self._abort.set()

    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray:
        return np.array([1 + ord(c) % (self.n_vocab - 1) for c in text], dtype=np.int32)

    def piece(self, token: int) -> bytes:
        return b"" if token == 0 else chr(ord("a") + int(token) % 26).encode()

    def is_eog(self, token: int) -> bool:
        return int(token) == 0

    def breaker_table(self, breakers):
        """DRY's restart sequences over the fake's vocabulary (its pieces, its tokenizer)."""
        from .._dry import breaker_table

        pieces = [self.piece(t) for t in range(self.n_vocab)]
        return breaker_table(pieces, lambda b: self.tokenize(b.decode("utf-8", "replace"), False), breakers)

    def close(self) -> None:
        self.closed = True
