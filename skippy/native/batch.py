"""A reusable llama_batch over numpy arrays: filling it is a vectorised copy, not a per-token loop."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InvalidBatchError
from . import _lib

_INT32 = np.iinfo(np.int32)
_I32, _I8 = np.dtype(np.int32), np.dtype(np.int8)


class Batch:
    """Token inputs for one llama_decode. Arrays are owned here; C sees pointers into them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise InvalidBatchError(f"batch capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.positions = np.zeros(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.outputs = np.zeros(capacity, dtype=np.int8)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        self.hidden: np.ndarray | None = None  # (capacity, n_embd) f32 once set_hidden is used
        self.carries_hidden = False
        self.n_tokens = 0
        self._struct: Any = None

    def set(
        self,
        tokens: ArrayLike,
        positions: ArrayLike,
        seq_ids: ArrayLike | int,
        outputs: ArrayLike | None = None,
    ) -> "Batch":
        """Load one step's tokens. `outputs` None = the last token of each sequence."""
        if (type(tokens) is np.ndarray and type(positions) is np.ndarray and type(seq_ids) is np.ndarray
                and tokens.dtype == _I32 and positions.dtype == _I32 and seq_ids.dtype == _I32
                and type(outputs) is np.ndarray and outputs.dtype == _I8 and tokens.ndim == 1):
            n = tokens.shape[0]  # the engine's own arrays (scheduling.composer): int32, 1-D
            if 0 < n <= self.capacity and positions.shape == seq_ids.shape == outputs.shape == (n,):
                self.tokens[:n] = tokens
                self.positions[:n] = positions
                self.seq_ids[:n] = seq_ids
                np.not_equal(outputs, 0, out=self.outputs[:n], casting="unsafe")  # astype(bool), no temporary
                self.n_tokens = n
                self.carries_hidden = False
                return self
        tok = np.asarray(tokens)
        n = tok.shape[0] if tok.ndim == 1 else -1
        if tok.ndim != 1 or n == 0:
            raise InvalidBatchError("tokens must be a non-empty 1-D sequence")
        if n > self.capacity:
            raise InvalidBatchError(f"{n} tokens exceed the batch capacity {self.capacity}")
        pos = np.asarray(positions)
        seq = np.full(n, seq_ids) if np.ndim(seq_ids) == 0 else np.asarray(seq_ids)
        for name, arr in (("positions", pos), ("seq_ids", seq)):
            if arr.shape != (n,):
                raise InvalidBatchError(f"{name} has shape {arr.shape}, expected ({n},)")
            if not np.issubdtype(arr.dtype, np.integer):
                raise InvalidBatchError(f"{name} must be integers, got {arr.dtype}")
        if not np.issubdtype(tok.dtype, np.integer):
            raise InvalidBatchError(f"tokens must be integers, got {tok.dtype}")
        for name, arr in (("tokens", tok), ("positions", pos), ("seq_ids", seq)):
            if arr.dtype != np.int32 and arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
                raise InvalidBatchError(f"{name} do not fit in int32")  # (int32 arrays, the engine's, always fit)
        self.tokens[:n] = tok
        self.positions[:n] = pos
        self.seq_ids[:n] = seq
        if outputs is None:
            self.outputs[:n] = 0
            self.outputs[last_index_per_sequence(self.seq_ids[:n])] = 1
        else:
            out = np.asarray(outputs)
            if out.shape != (n,):
                raise InvalidBatchError(f"outputs has shape {out.shape}, expected ({n},)")
            self.outputs[:n] = out.astype(bool)
        self.n_tokens = n
        self.carries_hidden = False
        return self

    def set_hidden(
        self,
        hidden: ArrayLike,
        positions: ArrayLike,
        seq_ids: ArrayLike | int,
        outputs: ArrayLike | None = None,
    ) -> "Batch":
        """Load hidden states (n_tokens, n_embd) instead of tokens: the input of a stage after the
        first (the previous stage's residual stream). f16 rows are widened to f32."""
        h = np.asarray(hidden)
        if h.ndim != 2 or h.shape[0] == 0 or h.shape[1] == 0:
            raise InvalidBatchError(f"hidden states must be a non-empty (n_tokens, n_embd) array, got shape {h.shape}")
        if h.dtype not in (np.float32, np.float16):
            raise InvalidBatchError(f"hidden states must be float32 or float16, got {h.dtype}")
        n, width = h.shape
        self.set(np.zeros(n, dtype=np.int32), positions, seq_ids, outputs)  # checks positions, seq ids, outputs
        if self.hidden is None or self.hidden.shape[1] != width:
            self.hidden = np.zeros((self.capacity, width), dtype=np.float32)
            self._struct = None
        self.hidden[:n] = h
        self.carries_hidden = True
        return self

    @property
    def n_embd(self) -> int:
        return 0 if self.hidden is None else self.hidden.shape[1]

    @property
    def n_outputs(self) -> int:
        return int(np.count_nonzero(self.outputs[: self.n_tokens]))

    def output_seq_ids(self) -> np.ndarray:
        """Seq id of each logits row, in row order."""
        n = self.n_tokens
        return self.seq_ids[:n][self.outputs[:n] != 0]

    def _as_c(self) -> Any:
        """The llama_batch struct, built once; only n_tokens changes per step."""
        if self._struct is None:
            ffi, lib = _lib.load()
            batch = ffi.new("struct llama_batch *")
            self._seq_ptrs = ffi.new("llama_seq_id *[]", self.capacity)
            self._seq_flat = ffi.from_buffer("llama_seq_id[]", self.seq_ids)
            lib.skippy_bind_seq_ids(self._seq_ptrs, self._seq_flat, self.capacity)
            # keep the buffer views alive as long as the struct that points into them
            self._views = (
                ffi.from_buffer("llama_token[]", self.tokens),
                ffi.from_buffer("llama_pos[]", self.positions),
                ffi.from_buffer("int32_t[]", self._n_seq_id),
                ffi.from_buffer("int8_t[]", self.outputs),
            )
            batch.token, batch.pos, batch.n_seq_id, batch.logits = self._views
            self._null = ffi.NULL
            self._hidden_view = ffi.NULL if self.hidden is None else ffi.from_buffer("float[]", self.hidden)
            batch.seq_id = self._seq_ptrs
            batch.embd = ffi.NULL
            self._struct = batch
            self._struct_hidden = False
        if self.carries_hidden != self._struct_hidden:
            # one struct, two kinds of input: llama.cpp reads embd when token is NULL
            self._struct.token = self._null if self.carries_hidden else self._views[0]
            self._struct.embd = self._hidden_view if self.carries_hidden else self._null
            self._struct_hidden = self.carries_hidden
        self._struct.n_tokens = self.n_tokens
        return self._struct[0]


def last_index_per_sequence(seq_ids: np.ndarray) -> np.ndarray:
    """Index of the last token of each distinct sequence in a batch."""
    n = seq_ids.shape[0]
    _, first_in_reversed = np.unique(seq_ids[::-1], return_index=True)
    return n - 1 - first_in_reversed
