"""Splits: the planner shares layers out by room and cuts only where a family allows; pinned
topologies are valid; the pipeline ceiling is its weakest stage and component."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippy.errors import InvalidInputError
from skippy.staged import (
    PINNED_N_LAYER,
    PINNED_SPLITS,
    SplitError,
    boundary_rule,
    even_split,
    pipeline_ceiling,
    plan_split,
    validate_split,
)

pytestmark = pytest.mark.staged


def sizes(split) -> list[int]:
    return [end - begin for begin, end in split]


# -- the planner


def test_layers_follow_budgets_a_weaker_node_gets_fewer():
    assert plan_split(30, [2000, 1000], 50) == [(0, 20), (20, 30)]
    assert plan_split(30, [1000, 3000, 2000], 10) == [(0, 5), (5, 20), (20, 30)]


def test_fixed_bytes_come_off_the_budget_first():
    # equal budgets, but stage 0 also holds 600 bytes of embeddings: room 400 vs 1000
    assert plan_split(70, [1000, 1000], 10, fixed_bytes=[600, 0]) == [(0, 20), (20, 70)]


def test_uneven_layers_are_weighed_by_bytes_not_counted():
    # last layer is as heavy as the other five together: equal budgets cut before it
    assert plan_split(6, [100, 100], [10, 10, 10, 10, 10, 50]) == [(0, 5), (5, 6)]


def test_a_budget_is_never_exceeded_even_against_proportion():
    # closest to proportional (8.9 / 31.1 bytes) is 11 / 29, but 11 bytes overflow stage 0
    assert plan_split(3, [10, 35], [5, 6, 29]) == [(0, 1), (1, 3)]


def test_ties_give_earlier_stages_the_extra_layer():
    assert even_split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert even_split(6, 1) == [(0, 6)]


def test_cuts_only_where_allowed():
    even = boundary_rule("qwen3next")
    assert even_split(8, 3, even) == [(0, 4), (4, 6), (6, 8)]
    assert plan_split(8, [300, 100], 10, allowed=even) == [(0, 6), (6, 8)]
    assert plan_split(8, [100, 100], 10, allowed=lambda b: b == 3) == [(0, 3), (3, 8)]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ((4, [], 1), "at least one stage"),
        ((2, [100, 100, 100], 1), "2 layers cannot give each of 3 stages"),
        ((4, [100, 5], 10), "stage 1 has 5 bytes of room"),
        ((4, [100, 100], 10, [95, 0]), "stage 0 has 5 bytes of room"),
        ((4, [20, 15], 10), "the layers need 40 bytes, the stages have 35"),
        ((4, [100, 100, 100], 1, 0, lambda b: b == 2), "3 stages need 2 cuts; only 1"),
        ((3, [15, 15], 10), "no split of 3 layers into 2 stages fits"),
        ((4, [100, 25], 10, 0, lambda b: b == 1), "no split of 4 layers"),
        ((4, [100, 100], [1, 2]), "layer_bytes has 2 entries for 4 layers"),
        ((4, [100, 100], 1, [0]), "fixed_bytes has 1 entries for 2 stages"),
    ],
)
def test_impossible_splits_are_named(args, problem):
    with pytest.raises(SplitError, match=problem):
        plan_split(*args)


def _proportional_error(split, per_layer, room) -> int:
    total, total_room = sum(per_layer), sum(room)
    return sum((sum(per_layer[b:e]) * total_room - total * r) ** 2 for (b, e), r in zip(split, room))


def _feasible_splits(per_layer, room, allowed):
    """Every contiguous split that fits, by brute force."""
    n_layer, n_stages = len(per_layer), len(room)
    for cuts in itertools.combinations([b for b in range(1, n_layer) if b in allowed], n_stages - 1):
        split = list(zip((0, *cuts), (*cuts, n_layer)))
        if all(sum(per_layer[b:e]) <= r for (b, e), r in zip(split, room)):
            yield split


@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=9),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), min_size=1, max_size=4),
    st.sets(st.integers(1, 8)),
)
def test_planner_finds_the_best_split_whenever_one_exists(per_layer, stages, allowed):
    budgets, fixed = [b for b, _ in stages], [f for _, f in stages]
    room = [b - f for b, f in stages]
    feasible = list(_feasible_splits(per_layer, room, allowed))
    if not feasible:
        with pytest.raises(SplitError):
            plan_split(len(per_layer), budgets, per_layer, fixed, allowed.__contains__)
        return
    split = plan_split(len(per_layer), budgets, per_layer, fixed, allowed.__contains__)
    assert split in feasible
    validate_split(split, len(per_layer), allowed.__contains__)
    best = min(_proportional_error(s, per_layer, room) for s in feasible)
    assert _proportional_error(split, per_layer, room) == best


@given(st.integers(1, 40), st.lists(st.integers(1, 60), min_size=1, max_size=5))
def test_more_room_never_means_fewer_layers(n_layer, budgets):
    try:
        split = plan_split(n_layer, budgets, 1)
    except SplitError:
        return
    for (room_a, n_a), (room_b, n_b) in itertools.permutations(zip(budgets, sizes(split)), 2):
        if room_a > room_b:
            assert n_a >= n_b


# -- validation


@pytest.mark.parametrize(
    ("ranges", "problem"),
    [
        ([], "at least one stage"),
        ([(1, 6)], "starts at layer 1, previous stage ended at 0: gap"),
        ([(0, 2), (4, 6)], "gap"),
        ([(0, 4), (2, 6)], "overlap"),
        ([(0, 0), (0, 6)], "holds no layers"),
        ([(0, 2), (2, 7)], "ends past the model's 6 layers"),
        ([(0, 2)], "cover layers \\[0, 2\\) of 6"),
        ([(0, 3), (3, 6)], "ends at layer 3, where this family may not be cut"),
    ],
)
def test_invalid_splits_are_named(ranges, problem):
    with pytest.raises(SplitError, match=problem):
        validate_split(ranges, 6, boundary_rule("qwen3next"))


# -- families: boundary rules and pinned topologies


def qwen3next_is_attention(layer: int) -> bool:
    return (layer + 1) % 2 == 0  # the synthetic model's full_attention_interval = 2


def test_qwen3next_cuts_only_after_an_attention_layer():
    rule = boundary_rule("qwen3next")
    assert [b for b in range(1, 8) if rule(b)] == [b for b in range(1, 8) if qwen3next_is_attention(b - 1)]
    assert [b for b in range(1, 12) if boundary_rule("qwen3next", full_attention_interval=4)(b)] == [4, 8]


@pytest.mark.parametrize("family", ["falcon-h1", "llama", "gemma2", "deepseek2", "smollm2", "gemma3"])
def test_other_families_cut_anywhere(family):
    assert all(boundary_rule(family)(b) for b in range(1, 30))


def test_unknown_family_has_no_rule():
    with pytest.raises(SplitError, match="no boundary rule for family 'mamba'"):
        boundary_rule("mamba")


def test_every_family_is_pinned_for_two_and_three_stages():
    families = {"llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next", "smollm2", "gemma3",
                "qwen2", "qwen3", "qwen3moe", "phi3"}  # the last four staged by patch 0007
    assert set(PINNED_SPLITS) == set(PINNED_N_LAYER) == families
    assert (PINNED_N_LAYER["smollm2"], PINNED_N_LAYER["gemma3"], PINNED_N_LAYER["qwen3next"]) == (30, 18, 8)
    for family, splits in PINNED_SPLITS.items():
        assert set(splits) == {2, 3}, family
        for n_stages, ranges in splits.items():
            assert len(ranges) == n_stages
            validate_split(ranges, PINNED_N_LAYER[family], boundary_rule(family))


@pytest.mark.parametrize("n_stages", [2, 3])
def test_pinned_qwen3next_stages_hold_both_memory_kinds(n_stages):
    for begin, end in PINNED_SPLITS["qwen3next"][n_stages]:
        kinds = {qwen3next_is_attention(layer) for layer in range(begin, end)}
        assert kinds == {True, False}


# -- the pipeline ceiling


def test_pipeline_ceiling_is_the_weakest_stage_and_component():
    assert pipeline_ceiling([{"attn": 64, "recurrent": 16}, {"attn": 32}]) == 16
    assert pipeline_ceiling([{"attn": 64, "recurrent": 16}, {"attn": 8, "swa": 40}]) == 8
    assert pipeline_ceiling([{"attn": 5}]) == 5


@pytest.mark.parametrize(
    ("ceilings", "problem"),
    [([], "at least one stage"), ([{"attn": 4}, {}], "stage 1 reported no memory components"),
     ([{"attn": -1}], "negative ceiling")],
)
def test_pipeline_ceiling_refuses_missing_reports(ceilings, problem):
    with pytest.raises(InvalidInputError, match=problem):
        pipeline_ceiling(ceilings)


# -- balanced_split: equal compute per stage, the output head on the last


def test_balanced_split_moves_layers_off_the_stage_with_the_head():
    from skippy.staged import balanced_split

    # SmolLM2's shape: 30 equal layers, a head worth 8 of them
    assert balanced_split([1] * 30, 8, 2) == [(0, 19), (19, 30)]
    assert balanced_split([1] * 30, 8, 3) == [(0, 13), (13, 25), (25, 30)]


def test_balanced_split_without_a_head_is_even():
    from skippy.staged import balanced_split

    for n_layer, k in [(6, 2), (6, 3), (30, 3), (7, 2)]:
        assert balanced_split([5] * n_layer, 0, k) == even_split(n_layer, k)


def test_balanced_split_keeps_the_cut_rule_and_every_stage_a_layer():
    from skippy.staged import balanced_split

    qwen = [2, 3] * 4  # recurrent, attention, ...: cuts only at even boundaries
    split = balanced_split(qwen, 1, 3, allowed=boundary_rule("qwen3next"))
    assert split == [(0, 4), (4, 6), (6, 8)]
    # a head bigger than all layers together still leaves the last stage one layer
    assert balanced_split([1] * 18, 30, 3) == [(0, 9), (9, 17), (17, 18)]
