"""Per-request sampling: greedy, seeded reproducibility, filters, and named errors for bad values."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy import sampling
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
        {"typical_p": 0.0},
        {"xtc_probability": 1.5},
        {"mirostat": 3},
        {"mirostat": 2, "mirostat_tau": -1.0},
        {"dry_multiplier": -1.0},
        {"dry_multiplier": 0.8, "dry_base": 0.5},
        {"dry_allowed_length": -1},
        {"dry_penalty_last_n": -2},
        {"dry_sequence_breakers": (1,)},
        {"dry_breakers": [("x", ())]},
        {"xtc_threshold": -0.1},
        {"typical_p": 1.2},
    ],
)
def test_bad_sampling_values_are_named_errors(kwargs):
    with pytest.raises(InvalidInputError):
        SamplingParams(**kwargs)


# -- pick sorts only a head of the order: the result must not depend on how much ------------------

def _reference_pick(logits: np.ndarray, p: SamplingParams, u: float, u_xtc: float | None = None) -> int:
    """pick's definition written out over the whole sorted order (no heads)."""
    x = np.asarray(logits, dtype=np.float32)
    ids = np.arange(x.size)
    if 0 < p.top_k < x.size:  # the k best by logit then id
        ids = np.sort(np.lexsort((ids, -x))[: p.top_k])
    xs = x[ids]
    w = np.exp((xs - xs.max()) / np.float32(p.temperature))
    keep = np.ones(xs.size, dtype=bool)
    if p.typical_p < 1:  # llama.cpp's llama_sampler_typical_apply (min_keep 1), as its loop
        prob = w / w.sum(dtype=np.float64)
        live = prob > 0
        logp = np.log(np.where(live, prob, 1.0))
        entropy = -float(np.dot(prob[live], logp[live]))
        shifted = [abs(-logp[i] - entropy) if live[i] else np.inf for i in range(xs.size)]
        order = sorted(range(xs.size), key=lambda i: (shifted[i], i))
        total, last = 0.0, len(order)
        for n, i in enumerate(order):
            total += prob[i]
            if total > p.typical_p:
                last = n + 1
                break
        keep[:] = False
        keep[order[:last]] = True
    if p.top_p < 1:
        order = [i for i in np.lexsort((np.arange(xs.size), -xs)) if keep[i]]
        limit = p.top_p * w[keep].sum(dtype=np.float64)
        before, keep[:] = 0.0, False
        for i in order:  # best first, while the weight before it is under the limit
            if keep.any() and before >= limit:
                break
            keep[i] = True
            before += np.float64(w[i])
    if p.min_p > 0:
        keep &= w >= np.float32(p.min_p) * w[keep].max()
    if u_xtc is not None and u_xtc <= p.xtc_probability and p.xtc_threshold <= 0.5:  # llama.cpp's XTC
        kept = np.flatnonzero(keep)
        prob = w[kept] / w[kept].sum(dtype=np.float64)
        ranked = sorted(range(kept.size), key=lambda i: (-xs[kept[i]], kept[i]))  # best first
        above = [i for i in ranked if prob[i] >= np.float32(p.xtc_threshold)]
        for i in above[:-1]:  # all but the last (least likely) of two or more
            keep[kept[i]] = False
    kept = np.flatnonzero(keep)
    return int(ids[kept[_reference_draw(w[kept], u, sampling.BLOCK)]])


def _reference_draw(w: np.ndarray, u: float, block: int) -> int:
    """The first index whose cumulative weight exceeds u x the total, summed a block at a time."""
    starts = range(0, w.size, block)
    edges = np.cumsum([w[i: i + block].sum(dtype=np.float64) for i in starts])
    target = u * edges[-1]
    b = next((j for j, e in enumerate(edges) if e > target), len(edges) - 1)
    before, run = (edges[b - 1] if b else 0.0), np.float64(0.0)
    chunk = w[b * block: (b + 1) * block]
    for i, x in enumerate(chunk):
        run += np.float64(x)
        if before + run > target:
            return b * block + i
    return b * block + chunk.size - 1


# few distinct values, so ties (at the top-k cut, in the order, at a head's edge) are common
tied_logits = st.lists(st.sampled_from([-np.inf, -3.0, -1.0, -0.0, 0.0, 0.5, 2.0, 2.5]), min_size=2, max_size=300).map(
    lambda xs: np.array(xs if max(xs) > -np.inf else [0.0, *xs], dtype=np.float32))
spread_logits = st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=2, max_size=300).map(
    lambda xs: np.array(xs, dtype=np.float32))
sampling_params = st.builds(
    SamplingParams, temperature=st.sampled_from([0.3, 1.0, 2.0]), top_k=st.sampled_from([0, 1, 3, 50]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]), min_p=st.sampled_from([0.0, 0.05, 0.5]),
    typical_p=st.sampled_from([1.0, 1.0, 0.95, 0.5, 0.2]), xtc_probability=st.sampled_from([0.0, 0.0, 0.5, 1.0]),
    xtc_threshold=st.sampled_from([0.05, 0.1, 0.3, 0.6]))


@given(st.one_of(tied_logits, spread_logits), sampling_params, st.floats(0, 1, exclude_max=True),
       st.sampled_from([(1,), (2, 5), (4, 16, 64)]), st.sampled_from([1, 3, 16, 1024]))
@settings(max_examples=400, deadline=None)
def test_pick_is_its_definition_whatever_the_heads_and_blocks(logits, params, u, heads, block):
    u_xtc = (u * 7.3) % 1 if params.xtc_probability else None
    with _patched(BLOCK=block):
        expected = _reference_pick(logits, params, u, u_xtc)
        for h in (heads, ()):
            with _patched(HEADS=h):
                assert sampling.pick(logits, params, u, u_xtc) == expected


@contextlib.contextmanager
def _patched(**values):
    saved = {k: getattr(sampling, k) for k in values}
    for k, v in values.items():
        setattr(sampling, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(sampling, k, v)


@given(st.lists(st.floats(-6, 6, width=32), min_size=1, max_size=40), st.sampled_from([1, 3, 1024]),
       st.sampled_from([0.5, 1.0, 1.7]))
@settings(max_examples=25, deadline=None)
def test_draws_over_a_fine_grid_land_in_proportion_to_the_weights(xs, block, temperature):
    logits = np.array(xs, dtype=np.float32)
    w = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
    grid = (np.arange(4000) + 0.5) / 4000
    with _patched(BLOCK=block):
        counts = np.bincount([sampling.pick(logits, SamplingParams(temperature=temperature), u) for u in grid],
                             minlength=logits.size)
    assert np.abs(counts / grid.size - w / w.sum()).max() < 3e-4  # a grid step is 2.5e-4


def test_top_k_ties_at_the_cut_go_to_the_lower_ids():
    logits = np.array([1.0, 5.0, 1.0, 1.0, 5.0], dtype=np.float32)
    # k=3: both 5.0s and the lowest-id 1.0 (id 0); a draw past the two 5.0s' share lands on id 0
    assert {sampling.pick(logits, SamplingParams(temperature=1.0, top_k=3), u) for u in np.linspace(0, 0.999, 50)} == {0, 1, 4}


def test_a_big_vocabulary_pick_matches_the_whole_sort():
    """A real-size row (SmolLM2's 49152 ids): draws across [0, 1) land in and far past the first head."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(49152) * 2).astype(np.float32)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.95, min_p=0.01),
                   SamplingParams(temperature=1.5, top_k=400)):
        for u in (0.0, 0.3, 0.9, 0.999, 0.9999999):
            assert sampling.pick(logits, params, u) == _reference_pick(logits, params, u)


@given(st.lists(st.one_of(st.floats(width=32, allow_nan=False), st.sampled_from([0.0, -0.0, 1.0])), min_size=1,
                max_size=200))
def test_the_whole_order_is_by_value_then_id(xs):
    x = np.array(xs, dtype=np.float32)
    assert sampling.best_first(x, x.size).tolist() == np.lexsort((np.arange(x.size), -x)).tolist()


@given(st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0]), min_size=2, max_size=60), st.integers(1, 59))
def test_top_k_ids_are_the_k_best_with_ties_to_the_lower_ids(xs, k):
    x = np.array(xs, dtype=np.float32)
    k = min(k, x.size - 1)
    assert sampling.top_k_ids(x, k).tolist() == sorted(np.lexsort((np.arange(x.size), -x))[:k].tolist())


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-46, 1e-44, 1e-40, 1e-38, 1e-30])
def test_a_tiny_temperature_picks_the_argmax_without_nan_or_warnings(temperature):
    """The fuzzer sent such temperatures. Below float32's least (5e-324, 1e-300, 1e-46) they are 0 in
    float32 and divided the weights by zero (NaN draws); above it, (x - max) / t overflows to -inf for
    every logit but the best, whose weight is exp(0) = 1 (the argmax, the limit), and numpy warned."""
    import warnings

    logits = np.array([0.5, 3.0, -1.0, 2.9], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a divide-by-zero or overflow RuntimeWarning fails the test
        for u in (0.0, 0.5, 0.999):
            assert sampling.pick(logits, SamplingParams(temperature=temperature), u) == 1


def test_typical_p_keeps_the_tokens_near_the_entropy_not_the_most_likely():
    """The likeliest token (p 0.17) and a flat tail of 100 (p 0.008 each): the entropy (4.3 nats) is
    near a tail token's surprisal (4.8), far from the likeliest's (1.8), so typical_p 0.5 keeps only
    tail tokens (as llama.cpp's typ_p sampler does)."""
    logits = np.array([3.0] + [0.0] * 100, dtype=np.float32)
    p = SamplingParams(temperature=1.0, typical_p=0.5, seed=1)
    s = Sampler(p)
    draws = {s(logits) for _ in range(200)}
    assert 0 not in draws and len(draws) > 5
    loose = Sampler(SamplingParams(temperature=1.0, seed=1))
    assert 0 in {loose(logits) for _ in range(100)}


def test_xtc_cuts_the_top_choices_but_the_least_likely_of_them_as_often_as_asked():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.05, 0.05], dtype=np.float32))
    always = Sampler(SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.1, seed=2))
    assert {always(logits) for _ in range(200)} == {2, 3, 4}  # 0 and 1 are above 0.1 and likelier than 2
    half = Sampler(SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1, seed=2))
    picks = [half(logits) for _ in range(2000)]
    share = sum(t in (0, 1) for t in picks) / len(picks)
    assert 0.3 < share < 0.4  # cut half the time: 0.5 x 0.7
    one_top = Sampler(SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.35, seed=2))
    assert 0 in {one_top(logits) for _ in range(100)}  # only one choice above: nothing cut
    a, b = (Sampler(SamplingParams(temperature=1.0, xtc_probability=0.5, seed=9)) for _ in range(2))
    assert [a(logits) for _ in range(50)] == [b(logits) for _ in range(50)]  # seeded, its draws included


def _mirostat_reference(logits: np.ndarray, p: SamplingParams, draws: list[float]) -> list[int]:
    """llama.cpp's mirostat v2 as its loop (candidates best first, truncated at the first too
    surprising), with skippy's draw (in id order) over what is kept."""
    mu, out = 2 * p.mirostat_tau, []
    for u in draws:
        x = logits.astype(np.float32) / np.float32(p.temperature)
        w = np.exp(x - x.max())
        prob = (w / w.sum(dtype=np.float64)).astype(np.float32)
        ranked = sorted(range(x.size), key=lambda i: (-x[i], i))
        size = next((n for n, i in enumerate(ranked) if -np.log2(prob[i]) > np.float32(mu)), len(ranked)) or 1
        kept = np.sort(np.array(ranked[:size]))
        index = sampling._draw(w[kept], u)
        surprise = float(-np.log2(np.float32(w[kept[index]] / w[kept].sum(dtype=np.float64))))
        mu = float(np.float32(mu - p.mirostat_eta * (surprise - p.mirostat_tau)))
        out.append(int(kept[index]))
    return out


@given(spread_logits, st.integers(0, 2**32 - 1), st.sampled_from([0.5, 1.0, 1.5]), st.sampled_from([1.0, 3.0, 5.0]))
@settings(max_examples=60, deadline=None)
def test_mirostat_v2_is_llama_cpps_loop_and_its_mu_is_part_of_the_state(logits, seed, temperature, tau):
    p = SamplingParams(temperature=temperature, mirostat=2, mirostat_tau=tau, mirostat_eta=0.3, seed=seed, top_k=2)
    draws = list(np.random.default_rng(seed).random(30))
    s = Sampler(p)  # top_k is ignored under mirostat, as in llama.cpp's chain
    assert [s(logits) for _ in range(30)] == _mirostat_reference(logits, p, draws)
    again = Sampler(p)
    for _ in range(10):
        again(logits)
    saved = again.state()
    after = [again(logits) for _ in range(5)]
    again.restore(saved)
    assert [again(logits) for _ in range(5)] == after


def test_mirostat_v2_steers_the_surprise_by_tau():
    """A higher target surprise draws less likely tokens (measured under the full softmax: mirostat
    counts it under the truncated one); the exact arithmetic is the reference test's."""
    logits = np.linspace(0, 40, 400).astype(np.float32)  # the likeliest at 3.4 bits, each next 0.14 bits more
    w = np.exp(logits.astype(np.float64) - logits.max())
    prob = w / w.sum()
    means = []
    for tau in (3.0, 6.0):
        s = Sampler(SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=tau, seed=4))
        means.append(np.mean([-np.log2(prob[s(logits)]) for _ in range(600)][100:]))
    plain = Sampler(SamplingParams(temperature=1.0, seed=4))
    free = np.mean([-np.log2(prob[plain(logits)]) for _ in range(500)])
    # 3 bits truncates (below the distribution's 4.6-bit entropy); 6 bits, above it, hardly does
    assert 3.4 <= means[0] < means[1] - 0.3 and means[0] < free - 0.5 and abs(means[1] - free) < 0.3
