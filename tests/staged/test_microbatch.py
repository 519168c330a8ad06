"""Micro-batch bookkeeping: a step cuts into parts that cover it once and in order, outputs
stay on a run's last piece; stage lanes hand out and take back sequence ids; answers go up in
the order micro-batches came down; a sample split into draw and pick is the same sample."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy.errors import InvalidBatchError, InvalidInputError
from skippy.sampling import Sampler, SamplingParams, pick
from skippy.staged._microbatch import (
    NoLaneError,
    ReplyOrder,
    Segment,
    StageLanes,
    UnknownRequestError,
    segments,
    split_step,
)

pytestmark = pytest.mark.staged


def step(runs: list[tuple[int, int, bool]]) -> tuple[np.ndarray, np.ndarray]:
    """(seq, length, output-on-last-row) runs -> the step's seq ids and output flags."""
    seq_ids = np.concatenate([np.full(length, seq, dtype=np.int32) for seq, length, _ in runs])
    outputs = np.zeros(len(seq_ids), dtype=bool)
    end = 0
    for _, length, output in runs:
        end += length
        outputs[end - 1] = output
    return seq_ids, outputs


# -- segments


def test_segments_are_maximal_runs_with_output_on_the_last_row():
    seq_ids, outputs = step([(3, 4, True), (1, 2, False), (7, 1, True)])
    assert segments(seq_ids, outputs) == [
        Segment(3, 0, 4, True),
        Segment(1, 4, 6, False),
        Segment(7, 6, 7, True),
    ]


def test_segments_output_row_before_a_runs_last_row_is_refused():
    seq_ids = np.array([5, 5, 5, 2], dtype=np.int32)
    outputs = np.array([False, True, False, True])
    with pytest.raises(InvalidBatchError):
        segments(seq_ids, outputs)
    # the same flag on the run's first row, too
    with pytest.raises(InvalidBatchError):
        segments(seq_ids, np.array([True, False, True, False]))


def test_segments_single_row_run():
    assert segments(np.array([9]), np.array([True])) == [Segment(9, 0, 1, True)]
    assert segments(np.array([9]), np.array([False])) == [Segment(9, 0, 1, False)]
    assert Segment(9, 0, 1, True).n_tokens == 1


def test_segments_a_sequence_coming_back_is_a_new_run():
    seq_ids = np.array([0, 0, 1, 0, 0, 0])
    outputs = np.array([False, True, True, False, False, True])
    assert segments(seq_ids, outputs) == [
        Segment(0, 0, 2, True),
        Segment(1, 2, 3, True),
        Segment(0, 3, 6, True),
    ]


# -- split_step


@st.composite
def steps(draw, max_len: int = 40):
    n_runs = draw(st.integers(1, 8))
    runs = []
    prev = None
    for _ in range(n_runs):
        seq = draw(st.integers(0, 5).filter(lambda s, prev=prev: s != prev))
        runs.append((seq, draw(st.integers(1, max_len)), draw(st.booleans())))
        prev = seq
    return runs


@settings(max_examples=300, deadline=None)
@given(steps(), st.integers(1, 5))
def test_split_step_properties(runs, parts):
    seq_ids, outputs = step(runs)
    n = len(seq_ids)
    # the generated runs are the step's maximal runs
    assert [(s.seq, s.n_tokens, s.output) for s in segments(seq_ids, outputs)] == runs

    batches = split_step(seq_ids, outputs, parts)

    assert 1 <= len(batches) <= parts
    assert all(batch for batch in batches)

    flat = [seg for batch in batches for seg in batch]
    # covers rows 0..n-1 exactly once, in order
    covered = [row for seg in flat for row in range(seg.start, seg.stop)]
    assert covered == list(range(n))
    assert all(seg.start < seg.stop for seg in flat)
    # each segment is within one sequence, and names it
    for seg in flat:
        assert (seq_ids[seg.start:seg.stop] == seg.seq).all()
    # the output flag sits exactly on the piece ending at an original output row
    for seg in flat:
        assert seg.output == bool(outputs[seg.stop - 1])
    assert sum(seg.output for seg in flat) == int(outputs.sum())
    # a cut run's output goes on its last piece only
    run_stops = {s.stop for s in segments(seq_ids, outputs)}
    for seg in flat:
        if seg.stop not in run_stops:
            assert not seg.output

    sizes = [sum(seg.n_tokens for seg in batch) for batch in batches]
    assert sum(sizes) == n
    if parts <= n:
        assert len(batches) == parts
        assert max(sizes) - min(sizes) <= max(length for _, length, _ in runs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 63), st.booleans()), min_size=1, max_size=40), st.integers(1, 5))
def test_split_step_decode_step_parts_are_even(rows, parts):
    # a decode step: every run is one row (make adjacent ids differ so each is its own run)
    runs = []
    for seq, output in rows:
        if runs and runs[-1][0] == seq:
            seq += 64
        runs.append((seq, 1, output))
    seq_ids, outputs = step(runs)
    n = len(seq_ids)
    batches = split_step(seq_ids, outputs, parts)
    assert len(batches) == min(parts, n)
    per_part = n / min(parts, n)
    for batch in batches:
        assert abs(sum(seg.n_tokens for seg in batch) - per_part) <= 1
        assert all(seg.n_tokens == 1 for seg in batch)
    assert [seg.output for batch in batches for seg in batch] == list(outputs)


def test_split_step_cuts_a_long_prefill_and_keeps_its_output_last():
    seq_ids, outputs = step([(4, 10, True)])
    assert split_step(seq_ids, outputs, 3) == [
        [Segment(4, 0, 3, False)],
        [Segment(4, 3, 7, False)],
        [Segment(4, 7, 10, True)],
    ]


def test_split_step_more_parts_than_rows():
    seq_ids, outputs = step([(0, 1, True), (1, 1, True)])
    assert split_step(seq_ids, outputs, 5) == [[Segment(0, 0, 1, True)], [Segment(1, 1, 2, True)]]


def test_split_step_one_part_is_the_whole_step():
    seq_ids, outputs = step([(0, 3, False), (1, 1, True), (0, 2, True)])
    assert split_step(seq_ids, outputs, 1) == [segments(seq_ids, outputs)]


@pytest.mark.parametrize("parts", [0, -1])
def test_split_step_needs_a_part(parts):
    seq_ids, outputs = step([(0, 3, True)])
    with pytest.raises(InvalidBatchError):
        split_step(seq_ids, outputs, parts)


def test_split_step_refuses_an_output_inside_a_run():
    with pytest.raises(InvalidBatchError):
        split_step(np.array([1, 1, 1]), np.array([True, False, True]), 2)


# -- StageLanes


def test_lanes_open_distinct_seqs_in_range_and_reopen_is_idempotent():
    lanes = StageLanes(4)
    seqs = [lanes.open(rid) for rid in (100, 200, 300, 400)]
    assert sorted(seqs) == [0, 1, 2, 3]
    assert lanes.open(200) == seqs[1]
    assert lanes.seq(300) == seqs[2]
    assert sorted(lanes.held()) == sorted(zip((100, 200, 300, 400), seqs))


def test_lanes_exhausted_then_release_frees_for_reuse():
    lanes = StageLanes(2)
    a = lanes.open(1)
    b = lanes.open(2)
    assert a != b
    with pytest.raises(NoLaneError):
        lanes.open(3)
    assert lanes.release(1) == a
    assert lanes.open(3) == a  # the only free lane is the one just released
    with pytest.raises(NoLaneError):
        lanes.open(4)
    assert sorted(lanes.held()) == sorted([(2, b), (3, a)])


def test_lanes_unknown_request():
    lanes = StageLanes(3)
    with pytest.raises(UnknownRequestError):
        lanes.seq(7)
    assert lanes.release(7) is None
    seq = lanes.open(7)
    assert lanes.release(7) == seq
    assert lanes.release(7) is None
    with pytest.raises(UnknownRequestError):
        lanes.seq(7)
    assert list(lanes.held()) == []


def test_lanes_held_is_a_snapshot():
    lanes = StageLanes(3)
    lanes.open(1)
    lanes.open(2)
    held = lanes.held()
    lanes.release(1)  # releasing while iterating must not break the iteration
    assert sorted(rid for rid, _ in held) == [1, 2]
    assert [rid for rid, _ in lanes.held()] == [2]


def test_lanes_zero_lanes_refuses_at_once():
    with pytest.raises(NoLaneError):
        StageLanes(0).open(1)


# -- ReplyOrder


def test_reply_order_waits_for_below_before_later_local_answers():
    order = ReplyOrder()
    order.expect_below()
    order.answer_here(["x"])
    order.answer_here(["y"])
    assert order.pending == 3
    assert order.ready() == []
    assert order.pending == 3
    order.from_below(["a"])
    assert order.ready() == ["a", "x", "y"]
    assert order.pending == 0
    assert order.ready() == []


def test_reply_order_below_answers_go_to_oldest_forwarded():
    order = ReplyOrder()
    order.answer_here(["h0"])
    order.expect_below()
    order.expect_below()
    order.answer_here(["h1", "h1b"])
    assert order.ready() == ["h0"]
    assert order.pending == 3
    order.from_below(["b0"])
    assert order.ready() == ["b0"]
    order.from_below(["b1"])
    assert order.ready() == ["b1", "h1", "h1b"]
    assert order.pending == 0


def test_reply_order_from_below_with_nothing_expected_is_refused():
    order = ReplyOrder()
    with pytest.raises(InvalidBatchError):
        order.from_below(["a"])
    order.expect_below()
    order.from_below(["a"])
    with pytest.raises(InvalidBatchError):
        order.from_below(["b"])
    assert order.ready() == ["a"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["below", "here", "answer", "ready"]), max_size=60), st.data())
def test_reply_order_random_interleavings_keep_registration_order(ops, data):
    order = ReplyOrder()
    registered: list[list] = []  # frames of each micro-batch, in registration order
    answered: list[bool] = []
    waiting: list[int] = []  # indices of forwarded micro-batches not yet answered from below
    out: list = []

    def check_ready():
        out.extend(order.ready())
        # everything out is the frames of the longest answered prefix, in order
        done = 0
        while done < len(registered) and answered[done]:
            done += 1
        assert out == [f for frames in registered[:done] for f in frames]
        assert order.pending == len(registered) - done

    for op in ops:
        i = len(registered)
        if op == "below":
            registered.append([("below", i)])
            answered.append(False)
            waiting.append(i)
            order.expect_below()
        elif op == "here":
            frames = [("here", i, j) for j in range(data.draw(st.integers(0, 2)))]
            registered.append(frames)
            answered.append(True)
            order.answer_here(frames)
        elif op == "answer":
            if not waiting:
                with pytest.raises(InvalidBatchError):
                    order.from_below(["stray"])
                continue
            k = waiting.pop(0)
            answered[k] = True
            order.from_below(registered[k])
        else:
            check_ready()
    while waiting:
        k = waiting.pop(0)
        answered[k] = True
        order.from_below(registered[k])
    check_ready()
    assert out == [f for frames in registered for f in frames]
    assert order.pending == 0


# -- sampling: draw then pick is the same sample


PARAMS = [
    SamplingParams(seed=11),
    SamplingParams(temperature=0.7, top_k=40, seed=11),
    SamplingParams(temperature=1.0, top_p=0.9, seed=11),
    SamplingParams(temperature=1.0, min_p=0.05, seed=11),
]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "temp0.7-topk40", "topp0.9", "minp0.05"])
def test_draw_then_pick_equals_direct_sample(params):
    rng = np.random.default_rng(2024)
    logits = [rng.normal(0, 3, size=512).astype(np.float32) for _ in range(50)]
    direct, split = Sampler(params), Sampler(params)
    a = [direct(x) for x in logits]
    b = [pick(x, params, split.draw()) for x in logits]
    assert a == b
    if params.greedy:
        assert a == [int(np.argmax(x)) for x in logits]
    else:
        # the draw matters: it is not always the top token, and another seed samples otherwise
        assert a != [int(np.argmax(x)) for x in logits]
        other = Sampler(attrs.evolve(params, seed=12))
        assert [other(x) for x in logits] != a


def test_greedy_draws_nothing():
    s = Sampler(SamplingParams(seed=3))
    assert s.draw() is None
    assert s.draw() is None
    assert pick(np.array([0.1, 2.0, -1.0]), s.params, None) == 1


def test_draws_are_uniforms_in_unit_interval_from_the_seed():
    p = SamplingParams(temperature=0.8, seed=5)
    u1 = [Sampler(p).draw() for _ in range(2)]
    assert u1[0] == u1[1]  # same seed, same first draw
    s = Sampler(p)
    draws = [s.draw() for _ in range(20)]
    assert all(isinstance(u, float) and 0.0 <= u < 1.0 for u in draws)
    assert len(set(draws)) == 20


@pytest.mark.parametrize("u", [None, 1.0, -0.1, 1.5])
def test_pick_non_greedy_needs_a_draw_in_unit_interval(u):
    p = SamplingParams(temperature=0.7, top_k=40, seed=1)
    with pytest.raises(InvalidInputError):
        pick(np.zeros(8, dtype=np.float32), p, u)


def test_pick_uses_the_draw():
    # three equal logits, no filters: u picks a third of the mass each, in id order
    p = SamplingParams(temperature=1.0)
    logits = np.zeros(3, dtype=np.float32)
    assert [pick(logits, p, u) for u in (0.0, 0.2, 0.4, 0.6, 0.7, 0.99)] == [0, 0, 1, 1, 2, 2]
