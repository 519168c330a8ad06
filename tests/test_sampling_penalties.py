"""Penalties and logit_bias in the per-request sampler: the arithmetic against a plain reference,
the history kept across failed steps (state/restore) and preemption, and seeded determinism
whatever shares the batch (the real engine over a FakeRuntime: scheduler plumbing, no llama claim)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy.errors import InvalidInputError
from skippy.runtime import sample_rows
from skippy.sampling import Sampler, SamplingParams
from skippy.testing import FakeRuntime, open_fake_engine

V = 16


def force(token: int) -> np.ndarray:
    """Logits whose pick is `token` whatever the penalties (they are bounded well below 1e4)."""
    x = np.zeros(V, dtype=np.float32)
    x[token] = 1e4
    return x


def reference(x: np.ndarray, p: SamplingParams, prompt: list[int], out: list[int]) -> np.ndarray:
    """The documented arithmetic, written plainly: bias, llama.cpp's repeat penalty over the window of
    prompt + output, then OpenAI's presence and frequency penalties over the output."""
    y = x.astype(np.float64).copy()
    for t, b in p.logit_bias:
        y[t] += b
    history = prompt + out
    window = [] if p.repeat_last_n == 0 else history if p.repeat_last_n < 0 else history[-p.repeat_last_n:]
    for t in set(window):
        y[t] = y[t] * p.repeat_penalty if y[t] <= 0 else y[t] / p.repeat_penalty
    for t in set(out):
        y[t] -= out.count(t) * p.frequency_penalty + p.presence_penalty
    return y


params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.8]),
    seed=st.integers(0, 100),
    presence_penalty=st.floats(-2, 2),
    frequency_penalty=st.floats(-2, 2),
    repeat_penalty=st.floats(0.5, 2.0),
    repeat_last_n=st.integers(-1, 12),
    logit_bias=st.dictionaries(st.integers(0, V - 1), st.floats(-100, 100), max_size=4),
)


@given(params_strategy, st.lists(st.integers(0, V - 1), max_size=10), st.lists(st.integers(0, V - 1), max_size=10),
       st.lists(st.floats(-10, 10), min_size=V, max_size=V))
@settings(max_examples=200, deadline=None)
def test_shaped_logits_match_the_reference(params, prompt, out, logits):
    s = Sampler(params, np.array(prompt, dtype=np.int32))
    for t in out:
        assert s(force(t)) == t
    x = np.array(logits, dtype=np.float32)
    np.testing.assert_allclose(s.shape(x), reference(x, params, prompt, out), rtol=1e-12, atol=1e-9)


def test_logit_bias_steers_greedy_and_false_bans():
    x = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
    assert Sampler(SamplingParams(logit_bias={0: 5.0}))(x) == 0
    assert Sampler(SamplingParams(logit_bias={3: -math.inf}))(x) == 2
    assert Sampler(SamplingParams(logit_bias={99: 100.0}))(x) == 3  # outside this vocabulary: no effect, no crash
    seen = {Sampler(SamplingParams(temperature=1.0, seed=s, logit_bias={3: -math.inf}))(x) for s in range(200)}
    assert 3 not in seen and seen == {0, 1, 2}


def test_a_penalised_greedy_row_is_not_the_raw_argmax_in_a_batch():
    """Greedy rows are picked in one vectorised argmax; a penalised one must not be among them."""
    plain, penalised = Sampler(), Sampler(SamplingParams(presence_penalty=2.0))
    assert penalised(force(3)) == 3  # now 3 was generated
    x = np.array([[0, 0, 1.5, 2.0] + [0] * (V - 4)] * 2, dtype=np.float32)
    assert sample_rows(x, [plain, penalised]).tolist() == [3, 2]


def test_repeat_penalty_sees_the_prompt_window():
    x = np.array([0.0, 1.0, 2.0, 2.2], dtype=np.float32)
    assert Sampler(SamplingParams(repeat_penalty=1.5), prompt=[3])(x) == 2  # 2.2 / 1.5 < 2
    assert Sampler(SamplingParams(repeat_penalty=1.5, repeat_last_n=1), prompt=[3, 0])(x) == 3  # 3 out of the window
    assert Sampler(SamplingParams(repeat_penalty=1.5, repeat_last_n=0), prompt=[3])(x) == 3  # off


def test_restore_rolls_back_the_history_with_the_rng():
    p = SamplingParams(temperature=1.0, seed=5, frequency_penalty=1.0, repeat_penalty=1.3, presence_penalty=0.4)
    x = np.linspace(0, 1, V).astype(np.float32)
    a = Sampler(p, prompt=[1, 2])
    b = Sampler(p, prompt=[1, 2])
    for _ in range(3):
        a(x)
        b(x)
    saved = a.state()
    a(force(7))  # a step that failed after sampling
    a.restore(saved)
    assert [a(x) for _ in range(10)] == [b(x) for _ in range(10)]


@pytest.mark.parametrize("kwargs", [
    {"repeat_penalty": 0.0}, {"repeat_penalty": float("nan")}, {"repeat_last_n": -2}, {"repeat_last_n": 1.5},
    {"presence_penalty": float("inf")}, {"frequency_penalty": "1"}, {"logit_bias": {-1: 1.0}},
    {"logit_bias": {1: float("nan")}}, {"logit_bias": {True: 1.0}}, {"logit_bias": [(1, 2, 3)]},
])
def test_bad_penalty_values_are_named_errors(kwargs):
    with pytest.raises(InvalidInputError):
        SamplingParams(**kwargs)


# -- through the engine (FakeRuntime) ---------------------------------------------------------


def prompt(i: int, n: int = 10) -> list[int]:
    return [(i * 13 + 5 * k) % 60 + 1 for k in range(n)]


async def run(engine, specs) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in specs]

    async def one(i, p, kw):
        out[i] = [e.token async for e in engine.generate(p, **kw) if e.token is not None]

    async with trio.open_nursery() as nursery:
        for i, (p, kw) in enumerate(specs):
            nursery.start_soon(one, i, p, kw)
    return out


PENALISED = dict(temperature=1.0, frequency_penalty=1.0, presence_penalty=0.5, repeat_penalty=1.5, repeat_last_n=8)


async def test_penalised_seeded_tokens_survive_batching_and_preemption():
    """Each request alone on a roomy fake, then four together on one that must preempt by recompute:
    the same tokens (the sampler's history and RNG stay with the request)."""
    specs = [(prompt(i), {"max_tokens": 30, "ignore_eos": True,
                          "sampling": SamplingParams(seed=100 + i, **PENALISED)}) for i in range(4)]
    with trio.fail_after(30):
        alone = []
        for spec in specs:
            async with open_fake_engine(FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)) as engine:
                alone += await run(engine, [spec])
        async with open_fake_engine(FakeRuntime(n_ctx=64, n_batch=16, n_seq_max=4), decode_reserve=2,
                                    max_preemptions=3) as engine:
            together = await run(engine, specs)
            assert engine.stats().preemptions > 0
        async with open_fake_engine(FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)) as engine:
            plain = await run(engine, [(p, {**kw, "sampling": SamplingParams(temperature=1.0, seed=kw["sampling"].seed)})
                                       for p, kw in specs])
    assert together == alone
    assert plain != alone  # the penalties did change what was drawn


async def test_presence_penalty_keeps_greedy_from_repeating():
    """The fake's logits are one-hot at a hash of the history; greedy repeats tokens, a presence
    penalty above the one-hot's height makes every generated token new."""
    p = prompt(3)
    with trio.fail_after(20):
        async with open_fake_engine(FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4, n_vocab=64)) as engine:
            greedy, penalised = await run(engine, [
                (p, {"max_tokens": 40, "ignore_eos": True}),
                (p, {"max_tokens": 40, "ignore_eos": True, "sampling": {"presence_penalty": 1.5}})])
    assert len(set(greedy)) < len(greedy)
    assert len(set(penalised)) == len(penalised) == 40
