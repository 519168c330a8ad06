"""Bad input is refused with a named error, and the process and context stay usable afterwards."""

from __future__ import annotations

import numpy as np
import pytest

from skippy._generate import generate_tokens
from skippy.errors import (
    ClosedError,
    ContextError,
    DecodeAbortedError,
    DecodeError,
    InvalidBatchError,
    InvalidInputError,
    ModelLoadError,
    NoKvSlotError,
)
from skippy.native import Batch, Context, ContextOptions, Model
from skippy.native.context import _decode_error

pytestmark = pytest.mark.native


def _still_decodes(ctx: Context) -> None:
    """The context survives: a fresh sequence still greedy-decodes."""
    ctx.seq_rm(-1)
    tokens = list(generate_tokens(ctx, [1, 300, 301, 302], 4, stop_at_eog=False))
    assert len(tokens) == 4


# -- model files ------------------------------------------------------------


def test_missing_model_file(tmp_path, llama_model):
    with pytest.raises(ModelLoadError, match="not found"):
        Model(tmp_path / "nope.gguf")
    assert not llama_model.closed


def test_not_a_gguf_file(tmp_path, small_ctx):
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Model(path)
    _still_decodes(small_ctx)


@pytest.mark.parametrize("keep", [0.5, 0.95])
def test_truncated_model_file(tmp_path, synth_model_path, small_ctx, keep):
    data = synth_model_path("llama").read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="truncated|malformed"):
        Model(path)
    _still_decodes(small_ctx)


def test_header_only_file(tmp_path):
    path = tmp_path / "header.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little"))
    with pytest.raises(ModelLoadError):
        Model(path)


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="not a file"):
        Model(tmp_path)


# -- batches ----------------------------------------------------------------


def _decode(ctx: Context, tokens, positions, seq_ids):
    return ctx.decode(Batch(64).set(tokens, positions, seq_ids))


@pytest.mark.parametrize("bad_token", [-1, "n_vocab", 2**31 - 1])
def test_token_outside_vocab(small_ctx, bad_token):
    token = small_ctx.n_vocab if bad_token == "n_vocab" else bad_token
    with pytest.raises(InvalidBatchError, match="outside the vocabulary"):
        _decode(small_ctx, [1, token], [0, 1], 0)
    assert small_ctx.seq_pos_max(0) == -1  # nothing reached the memory
    _still_decodes(small_ctx)


@pytest.mark.parametrize("seq", [4, 255, 256, -1])
def test_seq_id_outside_context(small_ctx, seq):
    with pytest.raises(InvalidBatchError, match="seq id"):
        _decode(small_ctx, [1, 2], [0, 1], seq)
    _still_decodes(small_ctx)


def test_seq_id_too_large_for_int32(small_ctx):
    with pytest.raises(InvalidBatchError, match="int32"):
        Batch(4).set([1], [0], 2**40)


def test_negative_position(small_ctx):
    with pytest.raises(InvalidBatchError, match="negative position"):
        _decode(small_ctx, [1, 2], [-1, 0], 0)
    _still_decodes(small_ctx)


@pytest.mark.parametrize("positions", [[0, 2, 3], [0, 1, 1], [2, 1, 0]])
def test_non_monotonic_positions_in_batch(small_ctx, positions):
    with pytest.raises(InvalidBatchError, match="consecutive"):
        _decode(small_ctx, [1, 2, 3], positions, 0)
    _still_decodes(small_ctx)


def test_position_gap_after_memory(small_ctx):
    _decode(small_ctx, [1, 2, 3], [0, 1, 2], 0)
    with pytest.raises(InvalidBatchError, match="memory ends at 2"):
        _decode(small_ctx, [4], [5], 0)
    with pytest.raises(InvalidBatchError, match="memory ends at 2"):
        _decode(small_ctx, [4], [2], 0)
    _decode(small_ctx, [4], [3], 0)
    assert small_ctx.seq_pos_max(0) == 3


def test_interleaved_sequences_are_checked_per_sequence(small_ctx):
    logits = _decode(small_ctx, [1, 5, 2, 6], [0, 0, 1, 1], [0, 1, 0, 1])
    assert logits.shape == (2, small_ctx.n_vocab)
    with pytest.raises(InvalidBatchError, match="seq 1"):
        _decode(small_ctx, [7, 8], [2, 4], [0, 1])


@pytest.mark.parametrize(
    "args, match",
    [
        (([], [], 0), "non-empty"),
        (([1, 2], [0], 0), "positions has shape"),
        (([1.5], [0], 0), "tokens must be integers"),
        (([1], [0.0], 0), "positions must be integers"),
        (([[1, 2]], [0], 0), "1-D"),
    ],
)
def test_malformed_batch_arrays(args, match):
    with pytest.raises(InvalidBatchError, match=match):
        Batch(8).set(*args)


def test_batch_over_capacity_and_over_n_batch(small_ctx):
    with pytest.raises(InvalidBatchError, match="capacity"):
        Batch(2).set([1, 2, 3], [0, 1, 2], 0)
    big = Batch(128).set(np.ones(65, dtype=np.int32), np.arange(65), 0)
    with pytest.raises(InvalidBatchError, match="n_batch"):
        small_ctx.decode(big)
    _still_decodes(small_ctx)


# -- options and memory calls ------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_seq_max": 257}, "n_seq_max"),
        ({"n_seq_max": 0}, "positive"),
        ({"n_ctx": -5}, "positive"),
        ({"n_ctx": 100_000_000_000}, "exceeds llama.cpp's limit"),  # not cffi's bare OverflowError
        ({"n_batch": 32, "n_ubatch": 64}, "n_ubatch"),
        ({"flash_attn": "maybe"}, "flash_attn"),
    ],
)
def test_bad_context_options(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        ContextOptions(**kwargs)


@pytest.mark.parametrize("call", ["seq_cp", "seq_keep", "seq_pos_max", "state_get"])
def test_memory_calls_reject_bad_seq_ids(small_ctx, call):
    args = {"seq_cp": (0, 9), "seq_keep": (9,), "seq_pos_max": (-1,), "state_get": (300,)}[call]
    with pytest.raises(InvalidInputError, match="seq id"):
        getattr(small_ctx, call)(*args)
    _still_decodes(small_ctx)


# -- decode return codes -----------------------------------------------------


def test_full_memory_is_no_kv_slot(llama_model):
    opts = ContextOptions(n_ctx=256, n_batch=256, n_ubatch=256, n_seq_max=1, threads=1)
    with Context(llama_model, opts) as ctx:
        full = Batch(256).set(np.full(ctx.n_ctx, 300), np.arange(ctx.n_ctx), 0)
        ctx.decode(full)
        with pytest.raises(NoKvSlotError) as info:
            ctx.decode(Batch(1).set([300], [ctx.n_ctx], 0))
        assert info.value.code == 1
        assert ctx.seq_pos_max(0) == ctx.n_ctx - 1  # a failed slot search changes nothing
        _still_decodes(ctx)


def test_abort_returns_code_2_and_context_recovers(small_ctx):
    small_ctx.abort()
    with pytest.raises(DecodeAbortedError) as info:
        _decode(small_ctx, [1, 2, 3], [0, 1, 2], 0)
    assert info.value.code == 2
    _still_decodes(small_ctx)


@pytest.mark.parametrize("code, cls", [(1, NoKvSlotError), (2, DecodeAbortedError), (-1, DecodeError), (-3, DecodeError)])
def test_decode_codes_map_to_named_errors(code, cls):
    err = _decode_error(code)
    assert type(err) is cls and err.code == code


# -- lifetimes ---------------------------------------------------------------


def test_use_after_close_is_a_named_error(synth_model_path):
    model = Model(synth_model_path("llama"))
    ctx = Context(model, ContextOptions(n_ctx=256, n_batch=32, n_ubatch=32, threads=1))
    model.close()  # closes its context first
    assert ctx.closed
    with pytest.raises(ClosedError):
        ctx.decode(Batch(1).set([1], [0], 0))
    with pytest.raises(ClosedError):
        _ = model.n_layer
    model.close()  # idempotent


def test_concurrent_decode_on_one_context_is_refused(small_ctx):
    small_ctx._guard.acquire()
    try:
        with pytest.raises(ContextError, match="in use"):
            _decode(small_ctx, [1], [0], 0)
    finally:
        small_ctx._guard.release()
