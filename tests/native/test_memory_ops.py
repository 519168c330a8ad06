"""seq_cp / seq_rm / state snapshots per KV class, observed through positions and the KV ledger."""

from __future__ import annotations

import numpy as np
import pytest

from skippy.kv import ComponentKind
from skippy.native import Batch, Context, ContextOptions, Model

pytestmark = pytest.mark.native

ATTN, SWA, REC = ComponentKind.ATTN, ComponentKind.SWA, ComponentKind.RECURRENT
PROMPT = np.arange(300, 320, dtype=np.int32)  # 20 tokens


def _open(synth_model_path, family: str):
    with Model(synth_model_path(family)) as model:
        opts = ContextOptions(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=4, threads=1)
        with Context(model, opts) as ctx:
            yield family, ctx


@pytest.fixture(params=["llama", "deepseek2", "gemma2", "falcon-h1", "qwen3next"])
def family_ctx(request, synth_model_path):
    yield from _open(synth_model_path, request.param)


@pytest.fixture(params=["falcon-h1", "qwen3next"])
def recurrent_ctx(request, synth_model_path):
    yield from _open(synth_model_path, request.param)


def _used(ctx: Context) -> dict[ComponentKind, int]:
    return ctx.ledger().used


def _prefill(ctx: Context, seq: int = 0) -> np.ndarray:
    return ctx.decode(Batch(64).set(PROMPT, np.arange(PROMPT.size), seq)).copy()


ATTENTION_ONLY = {"llama", "deepseek2", "gemma2"}


def test_ledger_counts_prefilled_cells(family_ctx):
    family, ctx = family_ctx
    assert all(v == 0 for v in _used(ctx).values())
    _prefill(ctx)
    used = _used(ctx)
    assert used[ATTN] == PROMPT.size
    if family == "gemma2":
        assert used[SWA] == PROMPT.size
    if family in ("falcon-h1", "qwen3next"):
        assert used[REC] == 1  # one whole state per sequence, whatever its length
    ctx.seq_rm(0)
    assert all(v == 0 for v in _used(ctx).values())


def test_seq_cp_shares_attention_cells_without_copying(family_ctx):
    family, ctx = family_ctx
    _prefill(ctx)
    before = _used(ctx)
    ctx.seq_cp(0, 1)
    assert ctx.seq_pos_max(1) == PROMPT.size - 1
    assert _used(ctx)[ATTN] == before[ATTN], "the copy shares the cells: no new attention cells"
    ctx.decode(Batch(1).set([330], [PROMPT.size], 1))
    assert _used(ctx)[ATTN] == before[ATTN] + 1
    ctx.seq_rm(0)
    assert ctx.seq_pos_max(0) == -1
    assert _used(ctx)[ATTN] == before[ATTN] + 1, "cells still owned by seq 1 survive seq 0's removal"
    ctx.seq_rm(1)
    assert all(v == 0 for v in _used(ctx).values())


def test_attention_positions_and_partial_removal(family_ctx):
    family, ctx = family_ctx
    _prefill(ctx)
    removed = ctx.seq_rm(0, 10, -1)
    if family in ATTENTION_ONLY:
        assert removed
        assert ctx.seq_pos_min(0) == 0 and ctx.seq_pos_max(0) == 9
        assert _used(ctx)[ATTN] == 10
    else:
        # a recurrent state holds only "after position 19": a tail cannot be cut off
        assert not removed
        assert ctx.seq_pos_max(0) == PROMPT.size - 1
        assert ctx.seq_pos_min(0) == PROMPT.size - 1


def test_recurrent_copy_is_a_whole_state(recurrent_ctx):
    family, ctx = recurrent_ctx
    _prefill(ctx)
    ctx.seq_cp(0, 1)
    # the copy starts out on the same state cell and gets its own on its first decode
    assert _used(ctx)[REC] == 1
    assert ctx.seq_pos_min(1) == ctx.seq_pos_max(1) == PROMPT.size - 1
    ctx.decode(Batch(1).set([330], [PROMPT.size], 1))
    assert _used(ctx)[REC] == 2


def test_continuing_a_copy_equals_continuing_the_original(family_ctx):
    """A shared prefix is read, not recomputed: the next-token logits are bit-identical."""
    family, ctx = family_ctx
    _prefill(ctx)
    ctx.seq_cp(0, 1)
    step = Batch(1)
    on_copy = ctx.decode(step.set([330], [PROMPT.size], 1)).copy()
    on_original = ctx.decode(step.set([330], [PROMPT.size], 0)).copy()
    np.testing.assert_array_equal(on_copy, on_original)


def test_state_snapshot_restores_a_sequence(family_ctx):
    """A per-sequence state snapshot restored elsewhere continues exactly like the original."""
    family, ctx = family_ctx
    _prefill(ctx)
    snapshot = ctx.state_get(0)
    assert len(snapshot) > 0
    step = Batch(1)
    expected = ctx.decode(step.set([330], [PROMPT.size], 0)).copy()
    ctx.decode(step.set([331], [PROMPT.size + 1], 0))  # move seq 0 on
    ctx.state_set(2, snapshot)
    assert ctx.seq_pos_max(2) == PROMPT.size - 1
    restored = ctx.decode(step.set([330], [PROMPT.size], 2)).copy()
    np.testing.assert_array_equal(restored, expected)


def test_sliding_window_component_is_recycled(synth_model_path):
    """gemma2 (window 8): the SWA component is sized by the window, not the context, and
    a sequence longer than it still decodes because out-of-window cells are reused."""
    with Model(synth_model_path("gemma2")) as model:
        opts = ContextOptions(n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=1, threads=1)
        with Context(model, opts) as ctx:
            swa_size = ctx.ledger().get(SWA).size
            assert swa_size < 640
            batch = Batch(64)
            for start in range(0, 640, 64):
                ctx.decode(batch.set(np.full(64, 300), np.arange(start, start + 64), 0))
            ledger = ctx.ledger()
            assert ledger.get(ATTN).used == 640
            assert ledger.get(SWA).used <= swa_size
            assert ctx.seq_pos_max(0) == 639
            assert ctx.seq_pos_min(0) > 0  # the oldest positions left the window


def test_clear_empties_every_component(family_ctx):
    family, ctx = family_ctx
    _prefill(ctx, seq=0)
    _prefill(ctx, seq=3)
    ctx.clear()
    assert all(v == 0 for v in _used(ctx).values())
    assert ctx.seq_pos_max(3) == -1
