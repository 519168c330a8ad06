"""The step-cost model (scheduling.cost), the latency targets (scheduling.slo) and the budget they set
(scheduling.budget): pure, on synthetic cost functions and a fake clock."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippy.scheduling import Composer, Request, RequestState
from skippy.scheduling.budget import TokenBudget
from skippy.scheduling.cost import MIN_SAMPLES, StepCostModel, StepShape, attended_kcells, equal_splits
from skippy.scheduling.slo import (ADVISORY_SPREAD, ADVISORY_STALL_SHARE, BORROW, LATE_STEP_TTFTS, MARGIN, REFERENCE_PROMPT, STALL_TPOTS,
                                  TPOT_FACTOR, SloPolicy,
                                  reference_ttft, sure_tokens)


def cpu(shape: StepShape, slow: float = 1.0) -> float:
    """A 2-core CPU's step, roughly (bench/results/step-shape): 5 ms, 3 ms a row, 3 ms a prompt token,
    20 us per thousand cells attended, 1 ms a new state, 8 ms a ubatch more (recurrent memory's splits)."""
    return slow * (5e-3 + 3e-3 * shape.decode_rows + 3e-3 * shape.prefill_tokens + 2e-5 * shape.attended_kcells
                   + 1e-3 * shape.new_states + 8e-3 * shape.splits)


def shapes(rng: np.random.Generator, n: int) -> list[StepShape]:
    out = []
    for _ in range(n):
        d, p = int(rng.integers(0, 33)), int(rng.integers(0, 257)) * int(rng.random() < 0.5)
        if d + p == 0:
            d = 1
        start = int(rng.integers(0, 2000))
        splits = int(rng.integers(1, 3)) * int(d > 0 and p > 0 and rng.random() < 0.5)  # beside decode rows
        out.append(StepShape(d, p, d * start / 1000.0 + attended_kcells(start, p), int(p > 0), splits))
    return out


def trained(n: int = 300, seed: int = 0, slow: float = 1.0, model: StepCostModel | None = None) -> StepCostModel:
    model = model or StepCostModel()
    for s in shapes(np.random.default_rng(seed), n):
        model.observe(s, cpu(s, slow))
    return model


def test_the_model_converges_to_a_step_cost_that_is_linear_in_the_shape():
    m = trained()
    assert m.calibrated
    for s in shapes(np.random.default_rng(1), 50):
        # 3%: the ridge holds the weakly excited directions (the fixed cost, new states, splits) near the
        # default prior (0) from a cold start; served, the probe at open sets the prior to this machine's fit
        assert math.isclose(m.seconds(s), cpu(s), rel_tol=0.03, abs_tol=2e-4), s
    assert math.isclose(m.per_decode_row(), 3e-3, rel_tol=0.05)
    assert math.isclose(m.per_prefill_token(), 3e-3, rel_tol=0.05)
    assert math.isclose(m.split_seconds(), 8e-3, rel_tol=0.05)


def test_the_model_adapts_when_the_machine_slows_down_mid_run():
    m = trained()
    probe = StepShape(8, 64, 8.0, 1)
    assert math.isclose(m.seconds(probe), cpu(probe), rel_tol=0.02)
    trained(200, seed=2, slow=2.0, model=m)  # the box halves its speed (a co-tenant, thermal limits)
    assert math.isclose(m.seconds(probe), cpu(probe, 2.0), rel_tol=0.05)


def test_a_steady_decode_run_keeps_what_the_model_knew_of_prompt_tokens():
    """Hundreds of identical decode steps excite one direction only: the ridge keeps the others at the prior."""
    m = trained()
    m.set_prior(m.theta())
    for _ in range(500):
        s = StepShape(4, 0, 4.0, 0)
        m.observe(s, cpu(s))
    assert math.isclose(m.per_prefill_token(), 3e-3, rel_tol=0.1)


def test_nonsense_and_empty_steps_are_not_evidence():
    m = StepCostModel()
    m.observe(StepShape(0, 0), 1.0)
    m.observe(StepShape(1, 0), float("nan"))
    m.observe(StepShape(1, 0), -1.0)
    m.observe(StepShape(1, 0), math.inf)
    assert m.samples == 0 and not m.calibrated


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 512), st.floats(0, 5000), st.integers(0, 8),
                          st.floats(1e-6, 10.0)), max_size=60),
       st.integers(0, 64), st.integers(0, 512), st.floats(0, 5000), st.integers(0, 8))
def test_the_model_never_predicts_a_negative_time_nor_a_zero_marginal_cost(steps, d, p, k, n):
    """Whatever it was fed (noise, contradictions, a single shape), predictions stay >= 0 and the costs the
    budget divides by stay positive."""
    m = StepCostModel()
    for sd, sp, sk, sn, secs in steps:
        m.observe(StepShape(sd, sp, sk, sn), secs)
    assert m.seconds(StepShape(d, p, k, n)) >= 0
    assert m.per_decode_row() > 0 and m.per_prefill_token(int(k)) > 0
    assert m.prefill_for(0.05, StepShape(d, 0, k, 0)) >= 0


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 4.0), st.integers(0, 10_000))
def test_the_model_converges_on_any_machine_speed(slow, seed):
    m = trained(200, seed=seed, slow=slow)
    s = StepShape(16, 32, 40.0, 1)
    assert math.isclose(m.seconds(s), cpu(s, slow), rel_tol=0.05)


# -- the targets -------------------------------------------------------------------------


def stream(rid: int, t_first: float, generated: int, remaining: int = 50, cached: int = 100) -> Request:
    r = Request(rid, np.arange(1, 11, dtype=np.int32), generated + remaining)
    r.generated = [1] * generated
    r.cached, r.seq_id, r.state = 10 + generated - 1, rid, RequestState.RUNNING
    r.t_first = t_first
    return r


def test_targets_not_given_are_derived_from_the_machine():
    slo = SloPolicy(trained())
    t = slo.resolve()
    assert t.derived and t.ttft_s is None
    assert math.isclose(t.tpot_s, TPOT_FACTOR * cpu(StepShape(1, 0, 0.129, 0)), rel_tol=0.05)
    r = Request(0, np.arange(1, 129, dtype=np.int32), 8, t_arrival=10.0)
    assert math.isclose(slo.first_deadline(r) - 10.0, 10 * cpu(StepShape(0, 128, attended_kcells(0, 128), 1)),
                        rel_tol=0.05)
    assert "derived" in t.describe(slo.cost)
    assert SloPolicy(StepCostModel()).resolve() is None  # nothing measured yet: nothing derived
    assert SloPolicy(StepCostModel(), ttft_s=1.0, tpot_s=0.05).resolve().tpot_s == 0.05


def test_a_step_takes_the_least_slack_of_the_on_time_streams_within_a_bound():
    """Banked slack alone (borrow=False); what tokens to come may lend: the test after the next."""
    slo = SloPolicy(trained(), ttft_s=2.0, tpot_s=0.05)
    now = 100.0
    behind = stream(0, t_first=now - 0.05 * MARGIN * 10, generated=10)  # exactly on its deadline pace
    ahead = stream(1, t_first=now - 0.2, generated=10)  # 10 tokens in 0.2 s: banked slack
    assert math.isclose(slo.step_seconds([ahead], now, False, borrow=False), STALL_TPOTS * 0.05)  # capped
    assert math.isclose(slo.step_seconds([behind, ahead], now, False, borrow=False), 0.0, abs_tol=1e-9)
    late = stream(2, t_first=now - 10.0, generated=10)  # a mean gap of 1 s: no pace can save it
    assert math.isclose(slo.step_seconds([late, ahead], now, False, borrow=False), STALL_TPOTS * 0.05)
    assert late.late
    assert slo.step_seconds([late], now, waiting_on_time=True) == math.inf  # prompts that can still make it
    # only late work left: steps of LATE_STEP_TTFTS of a TTFT target, so a backlog drains at batch throughput
    assert math.isclose(slo.step_seconds([late], now, waiting_on_time=False), LATE_STEP_TTFTS * 2.0)
    tight = SloPolicy(trained(), ttft_s=0.1, tpot_s=0.05)  # never shorter than one TPOT target
    late2 = stream(3, t_first=now - 10.0, generated=10)
    assert tight.step_seconds([late2], now, waiting_on_time=False) == 0.05
    derived = SloPolicy(trained(), tpot_s=0.001)  # TTFT derived per request: the reference prompt's
    late3 = stream(4, t_first=now - 10.0, generated=10)
    assert math.isclose(derived.step_seconds([late3], now, waiting_on_time=False),
                        max(0.001, LATE_STEP_TTFTS * reference_ttft(derived.cost)))


def test_the_budget_fills_what_the_slack_leaves_beside_the_decodes():
    cost = trained()
    slo = SloPolicy(cost, ttft_s=2.0, tpot_s=0.05)
    b = TokenBudget(512, slo)
    now = 100.0
    s = stream(0, t_first=now - 0.16, generated=4)  # token 4 is due 4 x 0.05 x MARGIN s after its first
    allowed = b.prefill_tokens([s], now, True)
    banked = slo.token_deadline(s, 0.05) - now
    assert math.isclose(banked, 4 * 0.05 * MARGIN - 0.16)
    decode = cost.seconds(slo.decode_shape([s]))  # the pace its tokens to come catch up at
    seconds = banked + BORROW * sure_tokens(s) * (MARGIN * 0.05 - decode)
    assert seconds > banked and seconds < STALL_TPOTS * 0.05
    assert math.isclose(slo.step_seconds([s], now, True), seconds)
    assert allowed == cost.prefill_for(seconds, slo.decode_shape([s]))
    predicted = cost.seconds(StepShape(1, allowed, slo.decode_shape([s]).attended_kcells, 0))
    assert predicted <= seconds + 1e-9 and allowed > 10
    assert b.prefill_tokens([], now) == 512  # no decodes: nobody to stall
    assert TokenBudget(512, None).prefill_tokens([s], now) == 511  # no budget
    tight = stream(1, t_first=now - 0.97, generated=20, remaining=1)  # overdue, its last token next: the floor
    assert b.prefill_tokens([tight], now, True) == 1
    behind = stream(2, t_first=now - 1.0, generated=20)  # overdue, but 19 tokens to come can make it up
    assert b.prefill_tokens([behind], now, True) > 1


def test_a_stream_lends_a_step_only_the_headroom_of_tokens_sure_to_come():
    r = stream(0, t_first=99.0, generated=4, remaining=60)
    assert sure_tokens(r) == 3  # it may stop at its end token: no more than it has made
    r.ignore_eos = True
    assert sure_tokens(r) == 59  # only the length ends it
    r.stop = ("\n",)
    assert sure_tokens(r) == 3
    r.min_tokens = 30
    assert sure_tokens(r) == 25  # nothing ends it before min_tokens
    slo = SloPolicy(trained(), ttft_s=2.0, tpot_s=0.2)  # a loose TPOT target, streams far ahead of its pace
    now = 100.0
    young = stream(1, t_first=now - 0.01, generated=1, remaining=63)  # just had its first token
    assert math.isclose(slo.step_seconds([young], now, True), 0.2 * MARGIN - 0.01)  # nothing sure to come
    young.ignore_eos = True  # 62 tokens to come at decode pace: it can spare a long step now
    assert math.isclose(slo.step_seconds([young], now, True), STALL_TPOTS * 0.2)
    cost = trained()
    probe = stream(2, t_first=now, generated=10)
    tpot = cost.seconds(slo.decode_shape([probe])) / MARGIN  # a decode-only step is the target pace itself
    on_pace = stream(2, t_first=now - 10 * tpot * MARGIN, generated=10)
    on_pace.ignore_eos = True
    tight = SloPolicy(cost, ttft_s=2.0, tpot_s=tpot)  # tokens to come cannot catch up: no headroom to lend
    assert math.isclose(tight.step_seconds([on_pace], now, True), 0.0, abs_tol=1e-9)


def test_the_composer_puts_on_time_prompts_before_late_ones_and_then_by_deadline():
    c = Composer(64, None)
    reqs = []
    for i, (late, deadline) in enumerate([(True, 1.0), (False, 5.0), (False, 3.0)]):
        r = Request(i, np.arange(1, 21, dtype=np.int32), 4)
        r.state, r.seq_id, r.late, r.deadline, r.admitted_at = RequestState.RUNNING, i, late, deadline, i
        reqs.append(r)
    c.add(reqs)
    plan = c.compose(cell_budget=45)
    assert [ch.request.id for ch in plan.chunks] == [2, 1, 0]
    assert [ch.n for ch in plan.chunks] == [20, 20, 5]
    assert plan.shape == StepShape(0, 45, attended_kcells(0, 20) * 2 + attended_kcells(0, 5), 3)


def test_late_streams_decode_only_in_the_time_on_time_work_leaves():
    cost = trained()
    slo = SloPolicy(cost, ttft_s=2.0, tpot_s=0.05)
    b = TokenBudget(512, slo)
    now = 100.0
    on = [stream(i, t_first=now - 0.05 * MARGIN * 10 + 0.03, generated=10) for i in range(4)]  # 30 ms of slack
    late = [stream(10 + i, t_first=now - 10.0, generated=10) for i in range(12)]
    for i, r in enumerate(late):
        r.late, r.t_arrival = True, 50.0 - i  # the last one arrived first
    kept = b.rows(on + late, [], now)
    assert kept[:4] == on
    taken = kept[4:]
    room = int((0.03 - cost.seconds(StepShape(4, 0, slo.decode_shape(on).attended_kcells, 0))) / cost.per_decode_row())
    assert 1 <= len(taken) == max(1, room) < len(late)  # what the slack holds, and never none: each late one ends
    assert taken == sorted(late, key=lambda r: r.t_arrival)[: len(taken)]  # oldest first
    assert b.rows(late, [], now) == late  # nothing on time runs or waits: nobody to protect
    overdue = [stream(20 + i, t_first=now - 0.05 * MARGIN * 10 - 0.01, generated=10) for i in range(4)]
    assert b.rows(overdue + late, [], now) == overdue + [late[-1]]  # no slack: only the one that always goes
    prompt = Request(30, np.arange(1, 201, dtype=np.int32), 8)
    prompt.cached, prompt.seq_id, prompt.state = 0, 30, RequestState.RUNNING
    assert len(b.rows(late, [prompt], now)) < len(late)  # an on-time prompt: late rows yield to it too
    assert TokenBudget(512, None).rows(on + late, [], now) == on + late  # no targets: everyone decodes


def test_the_composer_leaves_yielded_late_streams_out_without_calling_it_pressure():
    slo = SloPolicy(trained(), ttft_s=2.0, tpot_s=0.05)
    c = Composer(64, TokenBudget(64, slo))
    now = 100.0
    on = [stream(i, t_first=now - 0.05 * MARGIN * 10 - 0.01, generated=10) for i in range(4)]
    late = [stream(10 + i, t_first=now - 10.0, generated=10) for i in range(6)]
    for r in late:
        r.late = True
    c.add(on + late)
    plan = c.compose(now=now)
    assert plan.n_decode == 5 and plan.yielded == 5 and plan.starved == 0  # starved would preempt someone
    assert plan.advanced().yielded == 5


def test_a_late_request_starts_only_while_the_lanes_left_hold_the_on_time_streams_the_target_allows():
    slo = SloPolicy(trained(), ttft_s=2.0, tpot_s=0.05)
    now = 100.0
    on = [stream(i, t_first=now - 0.1, generated=4) for i in range(2)]
    late = stream(9, t_first=now - 10.0, generated=10)
    late.late = True
    gate = slo.gate(on + [late], now)
    rows = gate.max_rows()
    assert rows > 3 and gate.on_rows == 3  # two on-time streams and the late lane that always decodes
    lanes = 4 * rows
    assert gate.late_room(free_lanes=rows - 2 + 1, ceiling=lanes)
    assert not gate.late_room(free_lanes=rows - 2, ceiling=lanes)  # its lane is one an on-time arrival needs
    assert gate.late_room(free_lanes=4, ceiling=8)  # half the lanes are always theirs
    assert not gate.late_room(free_lanes=2, ceiling=8)
    assert gate.decode_room()  # late streams do not count against the rows on-time arrivals may have


def test_a_first_token_estimate_counts_the_rows_that_end_before_it():
    """Admission's estimate (SloGate.first_token_eta): running streams that end soon stop taking each step's
    time, and once none is left the prompt runs at full speed. Counting every row to the end marked a
    request late behind a few short streams about to finish."""
    cost = trained()
    slo = SloPolicy(cost, ttft_s=2.0, tpot_s=0.05)
    now, step = 100.0, MARGIN * 0.05
    new = Request(50, np.arange(1, 129, dtype=np.int32), 8, t_arrival=now)
    ending = [stream(i, t_first=now - 0.1, generated=4, remaining=2) for i in range(12)]
    endless = [stream(i, t_first=now - 0.1, generated=4, remaining=10_000) for i in range(12)]
    soon, late = slo.gate(ending, now).first_token_eta(new), slo.gate(endless, now).first_token_eta(new)
    # 12 rows for two steps, then the prompt alone: at most two steps and its own time
    assert soon <= now + 2 * step + cost.prefill_seconds(128) + 1e-9
    assert soon > now + cost.prefill_seconds(128) - 1e-9
    per_step = cost.prefill_for(step, StepShape(12, 0, slo.gate(endless, now).kcells, 0))
    assert per_step > 0 and math.isclose(late, now + math.ceil(128 / per_step) * step)  # rows that never end
    assert late > soon
    full = [stream(i, t_first=now - 0.1, generated=4, remaining=10_000) for i in range(40)]
    assert slo.gate(full, now).first_token_eta(new) == math.inf  # no step time left, and no row ends
    gate = slo.gate(ending[:1], now)
    gate.take(endless[0])  # an admitted request counts to its end too
    assert gate.ends == [2, 10_000] and gate.first_token_eta(new) > slo.gate(ending[:1], now).first_token_eta(new)


def test_admission_prices_a_row_with_its_cells_when_the_fit_puts_a_rows_cost_there():
    """Decode steps grow rows and cells together, and served on falcon-h1 the fit moved a row's whole cost
    into the cells coefficient (0 s a row). Admission must still count the new stream's row: with its
    cells, not as a free row beside the running ones' cells."""
    cost = StepCostModel(prior=np.array((5e-3, 0.0, 2e-3, 20e-3, 0.0, 0.0)))  # 20 ms a thousand cells, nothing a row
    cost.samples = MIN_SAMPLES
    slo = SloPolicy(cost, ttft_s=2.0, tpot_s=0.05)
    now = 100.0

    def running(n: int) -> list[Request]:
        out = []
        for i in range(n):
            r = Request(i, np.arange(1, 141, dtype=np.int32), 64)
            r.generated, r.cached, r.seq_id, r.state, r.t_first = [1] * 9, 148, i, RequestState.RUNNING, now - 1
            out.append(r)  # 149 cells each: 2.98 ms a row
        return out

    new = Request(99, np.arange(1, 149, dtype=np.int32), 64, t_arrival=now)
    # 5 ms + 14 rows x 2.98 ms = 46.7 ms <= 0.95 x 50 ms; a 15th (its 149 cells) makes 49.7 ms
    assert slo.gate(running(13), now).decode_room(new)
    assert not slo.gate(running(14), now).decode_room(new)
    assert slo.gate(running(14), now).max_rows() == 14
    assert not slo.gate(running(14), now).decode_room()  # one like the running ones
    assert cost.per_decode_row() == pytest.approx(1e-6) and cost.per_decode_row(0.149) == pytest.approx(2.98e-3)


def test_equal_splits_counts_the_ubatches_llama_cpp_makes_of_a_recurrent_batch():
    assert equal_splits([]) == 0 and equal_splits([1, 1, 1]) == 0  # decode rows: one ubatch
    assert equal_splits([1, 1, 64]) == 1  # a prompt chunk beside them: all x 1 token, then its 63 alone
    assert equal_splits([1, 64, 64]) == 1 and equal_splits([1, 64, 32]) == 2 and equal_splits([64, 32]) == 1


def prompt_req(rid: int, n: int, deadline: float) -> Request:
    r = Request(rid, np.arange(1, n + 1, dtype=np.int32), 8)
    r.state, r.seq_id, r.deadline, r.admitted_at = RequestState.RUNNING, rid, deadline, rid
    return r


def test_over_recurrent_memory_prompt_chunks_beside_decode_rows_share_one_length():
    """Each distinct chunk length is a ubatch of its own (the weights streamed again): beside decode rows the
    composer gives later prompts the first chunk's length or leaves them for a later step, and the budget
    prices the one split the first chunk makes."""
    cost = trained()
    slo = SloPolicy(cost, ttft_s=2.0, tpot_s=1.0)  # a loose target: the budget holds every chunk below
    now = 100.0

    def plan(equal_split: bool, sizes: list[int]):
        c = Composer(512, TokenBudget(512, slo), equal_split=equal_split)
        c.add([stream(i, t_first=now - 0.01, generated=1) for i in range(4)]
              + [prompt_req(10 + k, n, 101.0 + k) for k, n in enumerate(sizes)])
        return c.compose(now=now)

    mixed = plan(True, [20, 200, 8, 300])
    lengths = [ch.n for ch in mixed.chunks if not ch.decode]
    assert len(set(lengths)) == 1 and lengths[0] == 20 and len(lengths) == 3  # the 8-token one waits
    assert mixed.shape.splits == 1 == equal_splits(np.unique(mixed.seq_ids, return_counts=True)[1].tolist())
    plain = plan(False, [20, 200, 8, 300])
    assert plain.shape.splits == 0 and [ch.n for ch in plain.chunks if not ch.decode][:3] == [20, 200, 8]
    # the budget: one chunk beside the rows costs a split, so it takes that much less than where nothing splits
    on = [stream(i, t_first=now - 0.01, generated=1) for i in range(4)]
    b = TokenBudget(512, slo)
    whole, split = b.prefill_tokens(on, now, True), b.prefill_tokens(on, now, True, split=True)
    assert whole - split == pytest.approx(cost.split_seconds() / cost.per_prefill_token(), abs=1.5)


def test_advisory_targets_give_prompts_a_chunk_beside_the_decodes_however_far_behind_the_streams_are():
    """Derived targets (none configured) are advisory: a stream behind the derived TPOT is not marked late,
    and a step may still carry the prompts in flight spread over ADVISORY_SPREAD steps, within
    ADVISORY_STALL_SHARE of a step that fills n_batch; under a configured target of the same value those streams are late (they yield to
    on-time prompts, scheduling.budget)."""
    advisory = SloPolicy(trained())
    t = advisory.resolve()
    assert t.advisory and "advisory" in t.describe(advisory.cost)
    assert not SloPolicy(trained(), tpot_s=t.tpot_s).resolve().advisory
    assert not SloPolicy(trained(), ttft_s=2.0).resolve().advisory
    now = 100.0
    behind = [stream(i, t_first=now - 10.0, generated=10) for i in range(16)]  # mean gap 1 s: far behind
    b = TokenBudget(512, advisory)
    alone = b.prefill_tokens(behind, now, True, prompts=128)
    many = b.prefill_tokens(behind, now, True, prompts=8 * 128)
    assert not any(r.late for r in behind)
    assert abs(alone - 128 // ADVISORY_SPREAD) <= 8, alone  # the model's fit of `cpu`: within a few tokens
    # many prompts: as many tokens as keep the step within a share of one that fills n_batch
    kc = sum(r.cached + 1 for r in behind) / 1000.0
    full = cpu(StepShape(16, 512 - 16, kc + attended_kcells(0, 496), 1))
    fits = max(n for n in range(1, 497) if cpu(StepShape(16, n, kc + attended_kcells(0, n), 1)) <= ADVISORY_STALL_SHARE * full)
    assert 16 < fits < 8 * 128 // ADVISORY_SPREAD and abs(many - fits) <= 8, (many, fits)
    assert b.prefill_tokens(behind, now, True) == b.prefill_tokens(behind, now, True, prompts=REFERENCE_PROMPT * ADVISORY_SPREAD)
    assert advisory.gate(behind, now) is None  # admission holds nobody back for them
    held = [stream(i, t_first=now - 10.0, generated=10) for i in range(16)]
    configured = TokenBudget(512, SloPolicy(trained(), tpot_s=t.tpot_s))
    assert configured.prefill_tokens(held, now, True, prompts=4 * 128) == 512 - 16
    assert all(r.late for r in held)
