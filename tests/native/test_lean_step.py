"""The per-step path between two decodes (bench/results/lean-step): the engine's arrays load the same
batch as any other input, the batch check in C reports what the numpy one did, and the logits view a
decode returns is the current rows whatever view an earlier decode returned."""

from __future__ import annotations

import numpy as np
import pytest

from skippy.errors import InvalidBatchError
from skippy.native import Batch, Context


def _engine_arrays(tokens, positions, seq_ids, outputs):
    """As scheduling.composer builds them: int32 tokens, positions, seq ids, int8 outputs."""
    return (np.array(tokens, np.int32), np.array(positions, np.int32), np.array(seq_ids, np.int32),
            np.array(outputs, np.int8))


@pytest.mark.parametrize("outputs", [[0, 0, 1], [1, 1, 1], [0, 3, -1], [0, 0, 0]])
def test_the_engines_int32_arrays_load_the_batch_that_lists_load(outputs):
    a, b = Batch(8), Batch(8)
    a.set(*_engine_arrays([5, 6, 7], [0, 1, 2], [1, 1, 2], outputs))
    b.set([5, 6, 7], [0, 1, 2], [1, 1, 2], outputs)
    for name in ("tokens", "positions", "seq_ids", "outputs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.n_tokens == b.n_tokens == 3 and a.n_outputs == b.n_outputs


def test_engine_arrays_that_do_not_fit_still_get_the_checks():
    with pytest.raises(InvalidBatchError, match="capacity"):
        Batch(2).set(*_engine_arrays([1, 2, 3], [0, 1, 2], [0, 0, 0], [0, 0, 1]))
    tok, pos, seq, out = _engine_arrays([1, 2], [0, 1], [0, 0], [0, 1])
    with pytest.raises(InvalidBatchError, match="positions has shape"):
        Batch(4).set(tok, pos[:1], seq, out)


def test_the_first_failing_check_is_reported_in_the_numpy_checks_order(small_ctx: Context):
    # a bad token and a bad seq id: the token is named (the vocabulary is checked first)
    with pytest.raises(InvalidBatchError, match="outside the vocabulary"):
        small_ctx.decode(Batch(8).set([1, small_ctx.n_vocab], [0, 1], [0, 9]))
    # a bad seq id and a negative position: the seq id
    with pytest.raises(InvalidBatchError, match="seq id 9"):
        small_ctx.decode(Batch(8).set([1, 2], [-1, 0], [0, 9]))
    # seq 0 is not consecutive, seq 1 does not continue its memory: the batch's own order first
    small_ctx.decode(Batch(8).set([1, 2], [0, 1], [1, 1]))
    with pytest.raises(InvalidBatchError, match="positions of seq 0"):
        small_ctx.decode(Batch(8).set([1, 2, 3], [5, 0, 2], [1, 0, 0]))
    with pytest.raises(InvalidBatchError, match="seq 1 continues at position 5, but its memory ends at 1"):
        small_ctx.decode(Batch(8).set([1, 2, 3], [5, 0, 1], [1, 0, 0]))
    assert small_ctx.seq_pos_max(0) == -1 and small_ctx.seq_pos_max(1) == 1  # nothing reached the memory


def _fresh_logits(small_ctx: Context, tokens, positions, seq_ids) -> np.ndarray:
    """The rows a context that decoded only this batch gives (its own copy)."""
    ctx = Context(small_ctx.model, small_ctx.options)
    try:
        return np.array(ctx.decode(Batch(8).set(tokens, positions, seq_ids)))
    finally:
        ctx.close()


def test_each_decode_returns_its_own_rows_whatever_shape_came_before(small_ctx: Context):
    one = small_ctx.decode(Batch(8).set([10, 11], [0, 1], [0, 0]))
    assert one.shape == (1, small_ctx.n_vocab) and not one.flags.writeable
    first = np.array(one)
    two = small_ctx.decode(Batch(8).set([12, 20, 21], [2, 0, 1], [0, 1, 1]))
    assert two.shape == (2, small_ctx.n_vocab)
    two = np.array(two)  # valid until the next decode
    again = small_ctx.decode(Batch(8).set([13], [3], [0]))
    assert again.shape == (1, small_ctx.n_vocab)
    assert not np.array_equal(np.array(again), first)  # the rows of this decode, not the first one's
    # the same sequences alone in a fresh context (other cells, other batch shapes: close, not bit-equal)
    np.testing.assert_allclose(two[1], _fresh_logits(small_ctx, [20, 21], [0, 1], [0, 0])[0], atol=1e-3)
    np.testing.assert_allclose(again[0], _fresh_logits(small_ctx, [10, 11, 12, 13], [0, 1, 2, 3], [0, 0, 0, 0])[0],
                               atol=1e-3)
