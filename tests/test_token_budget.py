"""The step token budget (scheduling.budget) and its use in composition: pure, no timing."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from skippy.scheduling import Composer, Request, RequestState
from skippy.scheduling.budget import (
    BURST_STALL_SHARE, DEFAULT_STALL_FACTOR, FULL_STEP_SHARE, MIN_SAMPLES, StepCostModel, TokenBudget,
)


def fed(budget: TokenBudget, fixed: float, per_token: float, sizes=(1, 4, 8, 16, 32, 64, 128, 256)) -> TokenBudget:
    for n in sizes:
        budget.observe(n, fixed + per_token * n)
    return budget


def test_the_cost_model_recovers_a_linear_step_cost_and_refuses_to_guess():
    m = StepCostModel()
    for n in range(1, MIN_SAMPLES):
        m.observe(n, 0.005 + 0.001 * n)
    assert m.fit() is None  # too few steps
    m.observe(MIN_SAMPLES, 0.005 + 0.001 * MIN_SAMPLES)
    fixed, per_token = m.fit()
    assert math.isclose(fixed, 0.005, rel_tol=1e-9) and math.isclose(per_token, 0.001, rel_tol=1e-9)
    same = StepCostModel()
    for _ in range(20):
        same.observe(8, 0.01)  # one size only: no slope to learn
    assert same.fit() is None
    same.observe(0, 1.0)
    same.observe(4, float("nan"))
    assert len(same._samples) == 20  # empty steps and nonsense are not samples


def test_a_step_without_decodes_stalls_nobody_and_takes_the_whole_batch():
    b = fed(TokenBudget(512, target_s=0.001), 0.005, 0.001)
    assert b.prefill_tokens(0) == 512


def test_before_anything_is_measured_steps_fill_the_batch_as_before():
    assert TokenBudget(512, target_s=0.02).prefill_tokens(8) == 504


def test_a_target_bounds_the_prefill_that_joins_decodes():
    b = fed(TokenBudget(512, target_s=0.020, min_prefill=4), fixed=0.005, per_token=0.0005)
    # 5 ms + 0.5 ms x (8 decodes + p) <= 20 ms  ->  p = 22
    assert b.prefill_tokens(8) == 22
    assert b.prefill_tokens(500) == 4  # past the target: the floor
    assert b.prefill_tokens(510) == 2  # the floor, capped by what n_batch leaves


def test_without_a_target_a_mixed_step_costs_at_most_a_few_decode_only_steps():
    b = fed(TokenBudget(512, min_prefill=4), fixed=0.005, per_token=0.0005)
    target = DEFAULT_STALL_FACTOR * (0.005 + 0.0005 * 8)  # 4 x 9 ms = 36 ms -> (36 - 5) / 0.5 - 8 = 54
    assert b.prefill_tokens(8) == round((target - 0.005) / 0.0005) - 8 == 54


def test_prompts_always_move_and_zero_target_turns_the_budget_off():
    tight = fed(TokenBudget(512, target_s=0.001, min_prefill=32), 0.005, 0.0005)
    assert tight.prefill_tokens(64) == 32
    off = fed(TokenBudget(512, target_s=math.inf), 0.005, 0.0005)
    assert off.prefill_tokens(64) == 448


@given(fixed=st.floats(0, 0.05), per_token=st.floats(1e-5, 0.01), target=st.floats(0.001, 1.0),
       n_decode=st.integers(1, 511), floor=st.integers(1, 64))
def test_a_mixed_step_predicted_past_the_target_only_at_the_floor(fixed, per_token, target, n_decode, floor):
    b = fed(TokenBudget(512, target_s=target, min_prefill=floor), fixed, per_token)
    p = b.prefill_tokens(n_decode)
    assert 0 <= p <= 512 - n_decode
    predicted = fixed + per_token * (n_decode + p)
    assert predicted <= target + per_token * 1e-6 + 1e-12 or p <= floor


def request(rid: int, n: int, cached: int, generated=()) -> Request:
    r = Request(rid, np.arange(1, n + 1, dtype=np.int32), 64, arrival=rid)
    r.state, r.seq_id, r.cached, r.generated = RequestState.RUNNING, rid, cached, list(generated)
    return r


def test_composition_sends_every_decode_and_moves_a_long_prompt_each_step_within_the_budget():
    budget = fed(TokenBudget(256, target_s=0.010, min_prefill=8), fixed=0.002, per_token=0.0002)
    c = Composer(256, budget)
    decoders = [request(i, 4, 4, generated=[9]) for i in range(10)]
    long = request(10, 300, 0)
    c.add(decoders + [long])
    steps = 0
    while long.pending > 1:
        plan = c.compose()
        assert plan.n_decode == 10  # nobody's stream waits for the prompt
        prefill = plan.n_prefill
        assert 8 <= prefill <= budget.prefill_tokens(10)
        c.apply(plan, [5] * len(plan.output_requests), [b"a"] * len(plan.output_requests),
                [False] * len(plan.output_requests))
        for r in decoders:  # keep them decoding
            r.generated = r.generated[-1:]
            r.cached = r.n_tokens - 1
        steps += 1
    assert steps == math.ceil(300 / budget.prefill_tokens(10))  # (10 - 2) / 0.2 - 10 = 30 per step


def test_the_fit_follows_the_window_and_equals_a_fresh_fit_after_many_steps():
    m = StepCostModel(window=16)
    for i in range(1000):  # an old regime, then a new one that fills the window
        n = 1 + i % 37
        m.observe(n, (0.001 + 0.0001 * n) if i < 900 else (0.004 + 0.0003 * n))
    fixed, per_token = m.fit()
    assert math.isclose(fixed, 0.004, rel_tol=1e-6) and math.isclose(per_token, 0.0003, rel_tol=1e-6)


def test_a_burst_of_prompts_waiting_for_their_first_token_lifts_the_budget():
    budget = fed(TokenBudget(256, target_s=0.010, min_prefill=8), fixed=0.002, per_token=0.0002)
    c = Composer(256, budget)
    decoders = [request(i, 4, 4, generated=[9]) for i in range(2)]
    prompts = [request(10 + i, 100, 0) for i in range(3)]  # three prompts vs two streams: a burst
    c.add(decoders + prompts)
    plan = c.compose()
    assert plan.n_decode == 2 and plan.n_prefill == 254  # the whole batch
    c2 = Composer(256, budget)
    c2.add([request(i, 4, 4, generated=[9]) for i in range(3)] + [request(20, 100, 0)])  # steady: budgeted
    assert c2.compose().n_prefill == budget.prefill_tokens(3)


def test_the_second_half_of_a_wave_is_still_a_burst():
    """4 of 8 prompts started; of the other four one has only its last token left (it rides in the
    decode rows) and still waits for its first token: 4 waiting vs 4 streams is a burst, so the whole
    wave starts within one more step instead of staggering into budgeted mixed steps."""
    budget = fed(TokenBudget(256, target_s=0.010, min_prefill=8), fixed=0.002, per_token=0.0002)
    c = Composer(256, budget)
    streams = [request(i, 4, 4, generated=[9]) for i in range(4)]
    c.add(streams + [request(10, 60, 59)] + [request(11 + i, 60, 0) for i in range(3)])
    plan = c.compose()
    assert plan.n_decode == 5 and plan.n_prefill == 180  # all three prompts, not the budget's share
    assert budget.prefill_tokens(5) < 180
    c2 = Composer(256, budget)
    c2.add([request(i, 4, 4, generated=[9]) for i in range(5)] + [request(10 + i, 60, 0) for i in range(4)])
    assert c2.compose().n_prefill == budget.prefill_tokens(5)  # fewer waiting than streams: budgeted


def test_a_burst_stops_once_its_stalls_reach_their_share_of_the_tokens_left():
    budget = fed(TokenBudget(256, target_s=0.010, min_prefill=8), fixed=0.002, per_token=0.0002)
    c = Composer(256, budget)
    decoders = [request(i, 4, 4, generated=[9]) for i in range(3)]
    prompts = [request(10 + i, 100, 0) for i in range(7)]  # 7 prompts vs 3 streams: a burst
    c.add(decoders + prompts)
    left = sum(r.remaining for r in c.running)  # 10 x 64 - 3 = 637: 1% allows 6.37 stalled decodes
    assert BURST_STALL_SHARE * left < 9
    stalls = []
    for _ in range(3):
        plan = c.compose()
        stalls.append(plan.n_prefill == 256 - plan.n_decode)  # a full batch: every stream waits for it
    assert stalls == [True, True, False]  # 3 + 3 stalls fit in 6.37; a third burst step would make 9
    assert c.compose().n_prefill == budget.prefill_tokens(3)  # bounded by the budget again
    for r in prompts:  # the burst ends (every prompt has its first token): the next one starts afresh
        r.generated = [9]
        r.cached = r.n_tokens - 1
    c.compose()
    assert c.burst_stalls == 0


def test_without_a_target_many_streams_cap_a_mixed_step_at_a_share_of_a_full_batch_step():
    b = fed(TokenBudget(512, min_prefill=4), fixed=0.005, per_token=0.0005)
    full = 0.005 + 0.0005 * 512  # 261 ms
    cap = FULL_STEP_SHARE * full  # 52.2 ms
    # 200 decodes: four decode-only steps (420 ms) would be past the cap -> (52.2 - 5) / 0.5 - 200 < 0
    assert DEFAULT_STALL_FACTOR * (0.005 + 0.0005 * 200) > cap
    assert b.prefill_tokens(200) == 4  # the floor: prompts still move
    # 60 decodes: min(4 x 35 ms, 52.2 ms) -> (52.2 - 5) / 0.5 - 60 = 34
    assert DEFAULT_STALL_FACTOR * (0.005 + 0.0005 * 60) > cap
    assert b.prefill_tokens(60) == math.floor((cap - 0.005) / 0.0005 + 1e-6) - 60 == 34
