"""Per-request sampling: greedy, seeded reproducibility, filters, and named errors for bad values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy.errors import InvalidInputError
from skippy.sampling import Sampler, SamplingParams

logits_strategy = st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=64).map(
    lambda xs: np.array(xs, dtype=np.float32)
)


@given(logits_strategy)
def test_greedy_is_argmax(logits):
    assert Sampler()(logits) == int(np.argmax(logits))


@given(logits_strategy, st.integers(0, 2**32), st.floats(0.1, 2.0))
@settings(max_examples=50)
def test_same_seed_same_draws(logits, seed, temperature):
    params = SamplingParams(temperature=temperature, seed=seed)
    a, b = Sampler(params), Sampler(params)
    assert [a(logits) for _ in range(8)] == [b(logits) for _ in range(8)]


@given(logits_strategy, st.integers(1, 5), st.integers(0, 1000))
@settings(max_examples=50)
def test_top_k_only_draws_from_the_k_best(logits, k, seed):
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=k, seed=seed))
    kth = np.sort(logits)[::-1][min(k, logits.size) - 1]
    for _ in range(8):
        assert logits[sampler(logits)] >= kth


def test_top_k_one_is_greedy():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert all(Sampler(SamplingParams(temperature=5.0, top_k=1, seed=s))(logits) == 1 for s in range(20))


def test_min_p_and_top_p_cut_the_tail():
    logits = np.log(np.array([0.6, 0.3, 0.05, 0.05], dtype=np.float64)).astype(np.float32)
    seen_min_p = {Sampler(SamplingParams(temperature=1.0, min_p=0.2, seed=s))(logits) for s in range(200)}
    assert seen_min_p == {0, 1}
    seen_top_p = {Sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=s))(logits) for s in range(200)}
    assert seen_top_p == {0}


def test_temperature_spreads_draws():
    logits = np.zeros(4, dtype=np.float32)
    draws = {Sampler(SamplingParams(temperature=1.0, seed=s))(logits) for s in range(100)}
    assert draws == {0, 1, 2, 3}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"min_p": 2},
        {"seed": "x"},
    ],
)
def test_bad_sampling_values_are_named_errors(kwargs):
    with pytest.raises(InvalidInputError):
        SamplingParams(**kwargs)
