"""One llama_context: decode, memory operations, the KV ledger, per-sequence state.

Not thread-safe by design: the scheduler's RuntimeOwner is its only caller. A
guard turns accidental concurrent use into an error instead of memory corruption.
"""

from __future__ import annotations

import enum
import os
import threading
from typing import Any, Literal

import attrs
import numpy as np
from loguru import logger

from ..errors import (
    ClosedError,
    ContextError,
    DecodeAbortedError,
    DecodeError,
    InvalidBatchError,
    InvalidInputError,
    NoKvSlotError,
    StateError,
    UnsupportedMemoryError,
)
from ..kv import ComponentKind, Ledger, MemoryComponent
from .batch import Batch
from .model import Model

_KINDS = {int(k): k for k in ComponentKind}  # the ledger's kinds by value: a dict lookup per step, not an enum call

FlashAttn = Literal["auto", "on", "off"]
MAX_SEQ = 256  # llama_max_parallel_sequences() in the pinned build; checked at context creation


class FaultKind(enum.IntEnum):
    """Test only: the fault an armed context injects at llama.cpp's own failure point (patches/0008)."""

    COMPUTE = 1  # a ubatch's graph computes, then reports failure: llama_decode returns -3 -> DecodeError
    ABORT = 2  # a ubatch's compute is stopped by the abort callback: 2 -> DecodeAbortedError
    KV_SLOT = 3  # the memory finds no slot for the batch: 1 -> NoKvSlotError


# Test only: "KIND:AFTER[:COUNT]" (KIND compute | abort | kv_slot) arms every Context the process creates
# (Context.arm_test_fault), so a test can inject faults into a `skippy serve` subprocess. Never set it in serving.
TEST_FAULT_ENV = "SKIPPY_TEST_FAULT"


def parse_test_fault(spec: str) -> tuple[FaultKind, int, int]:
    """SKIPPY_TEST_FAULT's value -> (kind, after, count)."""
    kinds = ", ".join(k.name.lower() for k in FaultKind)

    def bad(why: str) -> InvalidInputError:
        return InvalidInputError(f"{TEST_FAULT_ENV}={spec!r}: {why} (KIND one of {kinds})")

    parts = spec.strip().split(":")
    if not 2 <= len(parts) <= 3:
        raise bad("expected KIND:AFTER[:COUNT]")
    kind = FaultKind.__members__.get(parts[0].strip().upper().replace("-", "_"))
    if kind is None:
        raise bad(f"unknown KIND {parts[0]!r}")
    try:
        after, count = int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise bad("AFTER and COUNT must be integers") from None
    if after < 0 or count == 0:
        raise bad("AFTER must be >= 0 and COUNT non-zero (negative: every point)")
    return kind, after, count


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


U32_MAX = 2**32 - 1  # llama_context_params' sizes are uint32_t


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{attribute.name} must be a positive integer, got {value!r}")
    if value > U32_MAX:  # cffi would raise a bare OverflowError at the assignment to llama's params
        raise InvalidInputError(f"{attribute.name} {value} exceeds llama.cpp's limit of {U32_MAX}")


@attrs.frozen
class ContextOptions:
    n_ctx: int = attrs.field(default=4096, validator=_positive)
    n_batch: int = attrs.field(default=512, validator=_positive)
    n_ubatch: int = attrs.field(default=512, validator=_positive)
    n_seq_max: int = attrs.field(default=1, validator=_positive)
    kv_unified: bool = True
    swa_full: bool = False  # the small sliding-window cache is the point of ISWA
    threads: int = attrs.field(factory=_default_threads, validator=_positive)
    flash_attn: FlashAttn = "auto"
    # Same logits for a sequence whatever shares its batch (patches/0002); needs flash attention.
    batch_invariant: bool = False

    def __attrs_post_init__(self) -> None:
        if self.n_seq_max > MAX_SEQ:
            raise InvalidInputError(f"n_seq_max {self.n_seq_max} exceeds llama.cpp's limit of {MAX_SEQ}")
        if self.n_ubatch > self.n_batch:
            raise InvalidInputError(f"n_ubatch {self.n_ubatch} exceeds n_batch {self.n_batch}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise InvalidInputError(f"flash_attn must be auto, on or off, got {self.flash_attn!r}")
        if self.batch_invariant and self.flash_attn == "off":
            raise InvalidInputError("batch_invariant needs flash attention (flash_attn auto or on)")


class Context:
    def __init__(self, model: Model, options: ContextOptions | None = None) -> None:
        self.model = model
        self.options = options or ContextOptions()
        self._ffi, self._lib = model._ffi, model._lib
        lib, opts = self._lib, self.options
        if int(lib.llama_max_parallel_sequences()) < opts.n_seq_max:
            raise InvalidInputError(f"n_seq_max {opts.n_seq_max} exceeds this build's limit")
        params = lib.llama_context_default_params()
        params.n_ctx = opts.n_ctx
        params.n_batch = opts.n_batch
        params.n_ubatch = opts.n_ubatch
        params.n_seq_max = opts.n_seq_max
        params.n_threads = opts.threads
        params.n_threads_batch = opts.threads
        params.kv_unified = opts.kv_unified
        params.swa_full = opts.swa_full
        params.batch_invariant = opts.batch_invariant
        params.no_perf = True
        params.flash_attn_type = {
            "auto": lib.LLAMA_FLASH_ATTN_TYPE_AUTO,
            "on": lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": lib.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[opts.flash_attn]
        fault_spec = os.environ.get(TEST_FAULT_ENV)
        fault = parse_test_fault(fault_spec) if fault_spec else None
        ptr = lib.llama_init_from_model(model._handle(), params)
        if ptr == self._ffi.NULL:
            raise ContextError(f"llama.cpp refused a context with {opts}; see the log above")
        self._ptr: Any = ptr
        self._mem = lib.llama_get_memory(ptr)
        self._abort_flag = self._ffi.new("int *", 0)
        lib.llama_set_abort_callback(ptr, lib.skippy_abort_if_flag, self._abort_flag)
        self._guard = threading.Lock()
        self._ledger_buf = self._ffi.new("struct llama_memory_component_info[]", 8)
        self._bad = self._ffi.new("int32_t[2]")  # skippy_check_batch's report
        self._logits_key: tuple[int, int] | None = None  # (address, rows) of the last logits view
        self._logits_view: np.ndarray | None = None
        self.n_vocab = model.n_vocab
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        self.n_batch = int(lib.llama_n_batch(ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(ptr))
        self._returns_hidden = model.returns_hidden
        model._contexts.add(self)
        if fault is not None:
            logger.warning("{}={}: this context injects test faults", TEST_FAULT_ENV, fault_spec)
            self.arm_test_fault(*fault)

    # -- lifetime ------------------------------------------------------------

    def _handle(self) -> Any:
        if self._ptr is None:
            raise ClosedError("context is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        with self._guard:
            if self._ptr is None:
                return
            self._lib.llama_free(self._ptr)
            self._ptr = None
            self._mem = None
            self._logits_key = self._logits_view = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._ptr is not None and not self.model.closed:
                self.close()
        except Exception:
            pass

    # -- decode --------------------------------------------------------------

    def decode(self, batch: Batch) -> np.ndarray:
        """Run one llama_decode; returns the output rows' logits, shape (n_outputs, n_vocab), or
        for a stage before the last every token's hidden state, shape (n_tokens, n_embd).

        The array is a zero-copy, read-only view into llama.cpp's buffer: it is
        valid until the next decode on this context. Copy what you keep.
        """
        if not self._guard.acquire(blocking=False):
            raise ContextError("context is already in use by another thread")
        try:
            ptr = self._handle()
            code = int(self._lib.llama_decode(ptr, self._validate(batch)))
            self._abort_flag[0] = 0
            if code != 0:
                raise _decode_error(code)
            if self._returns_hidden:
                return self._hidden_rows(ptr, batch.n_tokens)
            n_out = batch.n_outputs
            if n_out == 0:
                return np.empty((0, self.n_vocab), dtype=np.float32)
            logits = self._lib.llama_get_logits(ptr)
            key = (int(self._ffi.cast("uintptr_t", logits)), n_out)
            if key != self._logits_key:  # the same rows of the same buffer as the last decode's: that view
                view = np.frombuffer(self._ffi.buffer(logits, n_out * self.n_vocab * 4), dtype=np.float32)
                view = view.reshape(n_out, self.n_vocab)
                view.flags.writeable = False
                self._logits_key, self._logits_view = key, view
            return self._logits_view
        finally:
            self._guard.release()

    def _hidden_rows(self, ptr: Any, n_tokens: int) -> np.ndarray:
        """A stage before the last: every token's residual stream, (n_tokens, n_embd), the next
        stage's input. Same zero-copy, read-only terms as logits."""
        n_embd = self.model.n_embd
        rows = self._lib.llama_get_embeddings(ptr)
        if rows == self._ffi.NULL:
            raise ContextError("llama.cpp returned no hidden states for a stage before the last")
        view = np.frombuffer(self._ffi.buffer(rows, n_tokens * n_embd * 4), dtype=np.float32).reshape(n_tokens, n_embd)
        view.flags.writeable = False
        return view

    def abort(self) -> None:
        """Make the running (or next) decode return early with DecodeAbortedError. Thread-safe."""
        self._abort_flag[0] = 1

    # -- test-only fault injection (patches/0008) ---------------------------------

    def arm_test_fault(self, kind: FaultKind | str | None, after: int = 0, count: int = 1) -> None:
        """Test only: make llama.cpp fail at its own failure point, through its own cleanup. The fault
        fires at `count` consecutive injection points of `kind` (negative: every one until disarmed) once
        `after` have passed; points are counted from now. COMPUTE and ABORT: each ubatch's graph compute
        (one per decode while a batch fits one ubatch; a recurrent or hybrid model may split a batch);
        KV_SLOT: each decode. Replaces an earlier arming; None disarms. Waits for a running decode."""
        if kind is None:
            code, after, count = self._lib.LLAMA_TEST_FAULT_NONE, 0, 1
        else:
            try:
                code = int(FaultKind[kind.upper().replace("-", "_")] if isinstance(kind, str) else FaultKind(kind))
            except (KeyError, ValueError):
                raise InvalidInputError(f"unknown test fault kind {kind!r}") from None
        if not isinstance(after, int) or after < 0 or not isinstance(count, int) or count == 0:
            raise InvalidInputError(f"arm_test_fault needs after >= 0 and a non-zero count, got {after!r}, {count!r}")
        with self._guard:
            if int(self._lib.llama_test_fault_arm(self._handle(), code, after, count)) != 0:  # pragma: no cover
                raise InvalidInputError(f"llama.cpp refused the test fault {kind!r}:{after}:{count}")

    @property
    def test_faults_fired(self) -> int:
        """Test only: how many armed faults have fired on this context."""
        return int(self._lib.llama_test_fault_fired(self._handle()))

    def _validate(self, batch: Batch) -> Any:
        """The batch as llama_decode takes it, once every check passed (skippy_check_batch, in C: these
        run between two decodes, where numpy's small-array calls cost about 0.1 ms a step)."""
        n = batch.n_tokens
        if n == 0:
            raise InvalidBatchError("batch is empty")
        if n > self.n_batch:
            raise InvalidBatchError(f"{n} tokens exceed n_batch {self.n_batch}")
        if batch.carries_hidden != self.model.takes_hidden:
            want = "hidden states (Batch.set_hidden)" if self.model.takes_hidden else "tokens"
            raise InvalidBatchError(f"this model computes layers {self.model.layers}: its input is {want}")
        if batch.carries_hidden and batch.n_embd != self.model.n_embd:
            raise InvalidBatchError(f"hidden states are {batch.n_embd} wide, the model's n_embd is {self.model.n_embd}")
        c_batch = batch._as_c()
        bad = self._bad
        code = self._lib.skippy_check_batch(self._mem, c_batch, self.n_vocab, self.n_seq_max, bad)
        if code == 0:
            return c_batch
        i = bad[0]
        if code == 1:
            raise InvalidBatchError(f"token id {int(batch.tokens[i])} is outside the vocabulary [0, {self.n_vocab})")
        if code == 2:
            raise InvalidBatchError(f"seq id {int(batch.seq_ids[i])} is outside [0, n_seq_max={self.n_seq_max})")
        if code == 3:
            raise InvalidBatchError(f"negative position {int(batch.positions[i])}")
        if code == 4:
            raise InvalidBatchError(f"positions of seq {int(batch.seq_ids[i])} are not consecutive and increasing "
                                    "within the batch")
        if code == 5:
            raise InvalidBatchError(f"seq {int(batch.seq_ids[i])} continues at position {int(batch.positions[i])}, "
                                    f"but its memory ends at {bad[1]}")
        raise ContextError(f"n_seq_max {self.n_seq_max} is above llama.cpp's LLAMA_MAX_SEQ ({MAX_SEQ})")

    # -- memory --------------------------------------------------------------

    def _check_seq(self, seq_id: int, *, allow_all: bool = False) -> None:
        low = -1 if allow_all else 0
        if not isinstance(seq_id, (int, np.integer)) or not low <= seq_id < self.n_seq_max:
            raise InvalidInputError(f"seq id {seq_id!r} is outside [0, n_seq_max={self.n_seq_max})")

    def _memory(self) -> Any:
        self._handle()
        return self._mem

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of seq_id (-1 = every sequence). False if a partial removal is impossible."""
        self._check_seq(seq_id, allow_all=True)
        return bool(self._lib.llama_memory_seq_rm(self._memory(), seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Give dst the cells of src in [p0, p1): attention cells are shared, not copied."""
        self._check_seq(src)
        self._check_seq(dst)
        self._lib.llama_memory_seq_cp(self._memory(), src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        self._lib.llama_memory_seq_keep(self._memory(), seq_id)

    def seq_pos_min(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(self._lib.llama_memory_seq_pos_min(self._memory(), seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(self._lib.llama_memory_seq_pos_max(self._memory(), seq_id))

    def clear(self, data: bool = False) -> None:
        self._lib.llama_memory_clear(self._memory(), data)

    def ledger(self) -> Ledger:
        buf = self._ledger_buf
        n = int(self._lib.llama_memory_ledger(self._memory(), buf, len(buf)))
        if n < 0:
            from ..families import check_memory_type

            memory_type = self.memory_type()
            check_memory_type(memory_type, self.model.arch)  # names why, for "none"
            raise UnsupportedMemoryError(memory_type or "unknown", self.model.arch,
                                         "the KV ledger cannot describe this memory type")
        try:  # called every step: no check beyond what building the ledger does
            return Ledger(tuple(
                MemoryComponent(_KINDS[c.kind], c.size, c.used, c.bytes) for c in buf[0:min(n, len(buf))]
            ))
        except KeyError as exc:  # a component kind this skippy does not know
            raise UnsupportedMemoryError(self.memory_type() or "unknown", self.model.arch,
                                         f"the KV ledger reports an unknown component ({exc.args[0]} is not a valid "
                                         "ComponentKind)") from None

    def memory_type(self) -> str:
        """The C++ class of the memory llama.cpp built for this context ("llama_kv_cache", ...), "none"
        if it built none, "" where it cannot be read. Why: the ledger's dynamic_casts also accept a
        subclass it under-reports, so the type itself says whether the ledger is complete. Read from
        the object's RTTI under the Itanium C++ ABI (GCC and Clang on Linux and macOS): the word
        before the vtable points to the type_info, whose second word is the mangled name."""
        mem = self._memory()
        if mem == self._ffi.NULL:
            return "none"
        if os.name != "posix":
            return ""
        vtable = self._ffi.cast("void ***", mem)[0]
        type_info = self._ffi.cast("char **", vtable[-1])
        mangled = self._ffi.string(type_info[1]).decode("ascii", "replace").lstrip("*")
        name = mangled.lstrip("0123456789")  # <length><identifier> for a class at namespace scope
        return name if mangled[: len(mangled) - len(name)] == str(len(name)) else mangled

    # -- per-sequence state (recurrent snapshots) -----------------------------

    def state_get(self, seq_id: int) -> bytes:
        self._check_seq(seq_id)
        ptr = self._handle()
        size = int(self._lib.llama_state_seq_get_size(ptr, seq_id))
        buf = self._ffi.new("uint8_t[]", max(size, 1))
        written = int(self._lib.llama_state_seq_get_data(ptr, buf, size, seq_id))
        if written == 0 and size != 0:
            raise StateError(f"could not read the state of seq {seq_id}")
        return self._ffi.buffer(buf, written)[:]

    def state_set(self, seq_id: int, data: bytes) -> None:
        """Replace seq_id's state with a snapshot from state_get."""
        self._check_seq(seq_id)
        ptr = self._handle()
        read = int(self._lib.llama_state_seq_set_data(ptr, self._ffi.from_buffer(data), len(data), seq_id))
        if read == 0:
            raise StateError(f"could not restore a {len(data)}-byte state into seq {seq_id}")


def _decode_error(code: int) -> DecodeError:
    if code == 1:
        return NoKvSlotError(1, "no KV slot for the batch (memory is full)")
    if code == 2:
        return DecodeAbortedError(2, "decode aborted")
    return DecodeError(code, f"llama_decode failed with code {code}")
