"""Unit tests of the pure policies: admission, composition, victims, lanes, stop strings, sampling rows."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from skippy.errors import OverloadedError
from skippy.families import KvClass
from skippy.kv import ComponentKind, Ledger, MemoryComponent
from skippy.runtime import sample_rows
from skippy.sampling import Sampler, SamplingParams
from skippy.scheduling import (
    Admission,
    Composer,
    Headroom,
    Preemption,
    Request,
    RequestState,
    plan_lanes,
)
from skippy.scheduling.lanes import MemoryCosts, PlanError
from skippy.scheduling.text import StopMatcher, TextAssembler

ATTN, SWA, REC = ComponentKind.ATTN, ComponentKind.SWA, ComponentKind.RECURRENT


def req(rid: int, n: int = 10, max_tokens: int = 8, priority: int = 0) -> Request:
    return Request(rid, np.arange(1, n + 1, dtype=np.int32), max_tokens, priority=priority, arrival=rid)


def ledger(attn_free: int, size: int = 100, swa_used: int | None = None, rec: tuple[int, int] | None = None) -> Ledger:
    comps = [MemoryComponent(ATTN, size, size - attn_free, 0)]
    if swa_used is not None:
        comps.append(MemoryComponent(SWA, 40, swa_used, 0))
    if rec is not None:
        comps.append(MemoryComponent(REC, rec[0], rec[1], 0))
    return Ledger(tuple(comps))


# -- admission -----------------------------------------------------------------------------


def test_admission_is_fcfs_then_priority_and_never_skips_the_head():
    a = Admission(ceiling=8, max_waiting=10, decode_reserve=2)
    big, small, urgent = req(0, n=50), req(1, n=5), req(2, n=5, priority=-1)  # lower is served first
    for r in (big, small, urgent):
        a.submit(r)
    assert [r.id for r in a.waiting] == [2, 0, 1]
    admitted = a.admit(Headroom.of(ledger(attn_free=40), [], 2))
    assert [r.id for r in admitted] == [2], "the big head does not fit, so nothing behind it jumps the queue"
    assert urgent.state is RequestState.RUNNING and urgent.seq_id == 0
    assert [r.id for r in a.admit(Headroom.of(ledger(attn_free=100), [urgent], 2))] == [0, 1]


def test_admission_counts_promises_of_running_requests():
    a = Admission(ceiling=8, max_waiting=10, decode_reserve=4)
    running = req(0, n=30)
    running.state, running.seq_id, running.cached = RequestState.RUNNING, 7, 10  # 20 prompt tokens still to prefill
    a.submit(req(1, n=20))
    # free 50 - promised (20 pending + 4 reserve) = 26 >= 20 + 4
    assert len(a.admit(Headroom.of(ledger(attn_free=50), [running], 4))) == 1
    a.submit(req(2, n=20))
    assert a.admit(Headroom.of(ledger(attn_free=47), [running], 4)) == []


def test_admission_gates_every_component_but_never_on_sliding_window_use():
    a = Admission(ceiling=8, max_waiting=10, decode_reserve=2)
    a.submit(req(0))
    full_swa = ledger(attn_free=100, swa_used=40)  # SWA `used` counts lazily recycled cells
    assert len(a.admit(Headroom.of(full_swa, [], 2))) == 1
    a.submit(req(1))
    no_state_slot = ledger(attn_free=100, rec=(4, 4))
    assert a.admit(Headroom.of(no_state_slot, [], 2)) == []
    assert len(a.admit(Headroom.of(ledger(attn_free=100, rec=(4, 3)), [], 2))) == 1


def test_lanes_bound_admission_and_come_back():
    a = Admission(ceiling=2, max_waiting=10)
    for i in range(3):
        a.submit(req(i))
    got = a.admit(Headroom.of(ledger(attn_free=100), [], 2))
    assert [r.seq_id for r in got] == [0, 1] and len(a.waiting) == 1
    a.release(0)
    assert a.admit(Headroom.of(ledger(attn_free=100), got[1:], 2))[0].seq_id == 0


def test_overload_and_cancel_while_waiting():
    a = Admission(ceiling=1, max_waiting=2)
    a.submit(req(0))
    a.submit(req(1))
    extra = req(2)
    with pytest.raises(OverloadedError) as info:
        a.submit(extra)
    assert extra.state is RequestState.REJECTED and info.value.limit == 2
    first = a.waiting[0]
    assert a.cancel(first) and first.state is RequestState.CANCELLED and first.finish_reason == "cancelled"
    assert not a.cancel(first)


def test_requeued_requests_go_to_the_head_even_past_the_bound():
    a = Admission(ceiling=4, max_waiting=1)
    a.submit(req(5))
    victim = req(9)
    victim.state, victim.seq_id, victim.cached, victim.preemptions = RequestState.RUNNING, 3, 12, 1
    victim.generated = [4, 4]
    a.lanes.take(), a.lanes.take(), a.lanes.take(), a.lanes.take()
    a.requeue(victim)
    assert [r.id for r in a.waiting] == [9, 5]
    assert victim.cached == 0 and victim.seq_id is None and len(a.lanes) == 1


# -- composer ------------------------------------------------------------------------------


def running(rid: int, n: int, cached: int, seq: int, generated=()) -> Request:
    r = req(rid, n=n, max_tokens=50)
    r.generated = list(generated)
    r.cached, r.seq_id, r.state = cached, seq, RequestState.RUNNING
    return r


def test_compose_puts_every_decode_first_then_chunks_prefill_in_order():
    c = Composer(n_batch=16)
    a = running(0, n=40, cached=0, seq=0)  # prefilling
    b = running(1, n=5, cached=5, seq=1, generated=[7])  # decoding
    d = running(2, n=30, cached=0, seq=2)  # prefilling, behind a
    e = running(3, n=6, cached=6, seq=3, generated=[8])  # decoding
    c.add([a, b, d, e])
    plan = c.compose()
    assert [(ch.request.id, ch.n, ch.decode, ch.output) for ch in plan.chunks] == [
        (1, 1, True, True), (3, 1, True, True), (0, 14, False, False)]
    assert plan.tokens[:2].tolist() == [7, 8] and plan.positions[:2].tolist() == [5, 6]
    assert plan.positions[2:].tolist() == list(range(14)) and plan.seq_ids[2:].tolist() == [0] * 14
    assert plan.outputs.tolist() == [1, 1] + [0] * 14 and plan.mixed
    c.apply(plan, [11, 12], [b"x", b"y"], [False, False])
    assert a.cached == 14 and b.generated == [7, 11] and e.generated == [8, 12]
    plan = c.compose()
    assert [(ch.request.id, ch.n, ch.output) for ch in plan.chunks] == [(1, 1, True), (3, 1, True), (0, 14, False)]


def test_compose_resumes_a_preempted_request_from_prompt_plus_generated():
    c = Composer(n_batch=64)
    r = running(0, n=5, cached=0, seq=0, generated=[40, 41, 42])
    c.add([r])
    plan = c.compose()
    assert plan.tokens.tolist() == [1, 2, 3, 4, 5, 40, 41, 42] and plan.outputs.tolist()[-1] == 1
    events, _ = c.apply(plan, [43], [b"z"], [False])
    assert r.generated == [40, 41, 42, 43] and events[0].event.index == 3


def test_compose_within_the_cell_budget_starves_decodes_only_when_it_must():
    c = Composer(n_batch=16)
    rs = [running(i, n=4, cached=4, seq=i, generated=[9]) for i in range(3)]
    c.add(rs)
    assert c.compose(cell_budget=2).starved == 1
    assert c.compose(cell_budget=3).starved == 0


def test_apply_finishes_on_length_eog_and_stop_strings():
    c = Composer(n_batch=16)
    long_ = running(0, n=4, cached=4, seq=0, generated=[9])
    long_.max_tokens = 2
    eog = running(1, n=4, cached=4, seq=1, generated=[9])
    stop = running(2, n=4, cached=4, seq=2, generated=[9])
    stop.stop = ("lo w",)
    c.add([long_, eog, stop])
    stop.assembler = TextAssembler(stop.stop)
    events, finished = c.apply(c.compose(), [5, 0, 6], [b"a", b"", b"hel"], [False, True, False])
    assert [e.event.finish_reason for e in events] == ["length", "stop", None]
    assert finished == [long_, eog] and c.running == [stop]
    assert events[2].event.text == "he"  # "l" could start the stop string: held back
    events, _ = c.apply(c.compose(), [7], [b"lo wor"], [False])
    assert events[0].event.finish_reason == "stop" and events[0].event.text == "l"
    assert events[0].event.usage.completion_tokens == 3


def test_apply_with_ignore_eos_keeps_going_past_end_of_generation_until_length():
    c = Composer(n_batch=16)
    r = running(0, n=4, cached=4, seq=0, generated=[9])
    r.max_tokens, r.ignore_eos = 3, True
    c.add([r])
    events, finished = c.apply(c.compose(), [0], [b""], [True])
    assert events[0].event.finish_reason is None and finished == [] and c.running == [r]
    events, finished = c.apply(c.compose(), [0], [b"x"], [True])
    assert events[0].event.finish_reason == "length" and finished == [r]


def test_stop_matcher_holds_back_only_what_could_still_match():
    m = StopMatcher(("END", "xy"))
    assert m.push("abcE") == ("abc", False)
    assert m.push("Nx") == ("EN", False)
    assert m.push("q") == ("xq", False)
    assert m.push("zzEN") == ("zz", False)
    assert m.push("D tail") == ("", True)
    t = TextAssembler(())
    assert t.push("é".encode()[:1]) == ("", False)
    assert t.push("é".encode()[1:]) == ("é", False)


# -- preemption ----------------------------------------------------------------------------


def test_victims_newest_first_and_fewest_outputs_first():
    a = running(0, n=10, cached=12, seq=0, generated=[1, 1])
    b = running(1, n=10, cached=20, seq=1, generated=[1] * 10)
    d = running(2, n=10, cached=11, seq=2, generated=[1])
    a.admitted_at, b.admitted_at, d.admitted_at = 0, 2, 1
    assert Preemption("newest").choose([a, b, d], {ATTN: 5}) == [b]
    assert Preemption("fewest_outputs").choose([a, b, d], {ATTN: 5}) == [d]
    assert Preemption("newest").choose([a, b, d], {ATTN: 25}) == [b, d]
    low = running(3, n=10, cached=10, seq=3)
    low.priority, low.admitted_at = 1, 0  # a higher value is a lower priority: the first victim
    assert Preemption("newest").choose([a, b, d, low], {ATTN: 5}) == [low]


def test_a_request_preempted_too_often_is_pinned_and_never_chosen_again():
    p = Preemption("newest", max_preemptions=2)
    r = running(0, n=10, cached=10, seq=0)
    for _ in range(2):
        assert p.choose([r], {ATTN: 1}) == [r]
        p.preempted(r)
    assert r.pinned and p.choose([r], {ATTN: 1}) == []
    # pinned requests are re-admitted with a reservation for all their remaining tokens
    a = Admission(ceiling=4, max_waiting=4, decode_reserve=2)
    r.state, r.seq_id, r.cached = RequestState.WAITING, None, 0
    a.submit(r)
    assert a.admit(Headroom.of(ledger(attn_free=10 + 49), [], 2)) == []
    assert a.admit(Headroom.of(ledger(attn_free=10 + 50), [], 2)) == [r]


# -- lanes ---------------------------------------------------------------------------------


def test_lane_ceiling_is_derived_and_family_aware():
    dense = plan_lanes(KvClass.DENSE, n_ctx=4096, n_batch=512)
    assert dense.ceiling == 32 and dense.n_seq_max == 32
    assert plan_lanes(KvClass.DENSE, n_ctx=1 << 20, n_batch=4096).ceiling == 256
    assert plan_lanes(KvClass.DENSE, n_ctx=1 << 20, n_batch=4096, reserved=32).n_seq_max == 256
    state = MemoryCosts(attn_bytes_per_cell=0.0, recurrent_bytes_per_seq=16 * 2**20)
    hybrid = plan_lanes(KvClass.SSM_HYBRID, n_ctx=1 << 20, n_batch=4096, costs=state, memory_bytes=128 * 2**20)
    assert hybrid.ceiling == 8 and "recurrent" in hybrid.reason
    assert plan_lanes(KvClass.DENSE, n_ctx=4096, n_batch=512, requested=3).ceiling == 3
    assert plan_lanes(KvClass.DENSE, n_ctx=256, n_batch=64, requested=8).ceiling == 8  # admission gates memory
    assert plan_lanes(KvClass.DENSE, n_ctx=256, n_batch=64, requested=300).ceiling == 64


def test_the_prefix_cache_is_a_co_tenant_of_the_pool_and_of_the_seq_ids():
    plan = plan_lanes(KvClass.DENSE, n_ctx=4096, n_batch=512, reserved=8, prefix_fraction=0.5)
    assert plan.ceiling == (4096 - 2048) // 128 and plan.n_seq_max == plan.ceiling + 8
    assert plan.prefix_budget_tokens == 2048
    assert plan_lanes(KvClass.DENSE, n_ctx=1 << 20, n_batch=4096, reserved=8, prefix_fraction=0.5).ceiling == 248


def test_the_recurrent_ceiling_falls_as_the_state_grows():
    ceilings = []
    for mib in (1, 4, 16, 64):
        costs = MemoryCosts(attn_bytes_per_cell=1024.0, recurrent_bytes_per_seq=mib * 2**20)
        ceilings.append(plan_lanes(KvClass.LINEAR_HYBRID, n_ctx=4096, n_batch=512, costs=costs,
                                   memory_bytes=512 * 2**20).ceiling)
    assert ceilings == sorted(ceilings, reverse=True) and ceilings[0] > ceilings[-1]
    assert ceilings[-1] == (512 * 2**20 - 4096 * 1024) // (64 * 2**20)  # every state paid from the budget
    # reserved ids (resident prefixes) hold a state each too, taking at most half the states
    costs = MemoryCosts(attn_bytes_per_cell=0.0, recurrent_bytes_per_seq=2**20)
    plan = plan_lanes(KvClass.SSM_HYBRID, n_ctx=4096, n_batch=512, costs=costs, memory_bytes=10 * 2**20, reserved=8)
    assert plan.reserved == 5 and plan.ceiling == 5 and plan.bytes[ComponentKind.RECURRENT] == 10 * 2**20


def test_the_ceiling_never_exceeds_llama_max_seq_minus_reserved():
    for kv in KvClass:
        for reserved in (0, 8, 64):
            plan = plan_lanes(kv, n_ctx=1 << 22, n_batch=1 << 14, reserved=reserved, floor_ctx_per_session=1)
            assert plan.ceiling <= 256 - plan.reserved and plan.n_seq_max <= 256


def test_a_memory_budget_sizes_the_pool_too():
    costs = MemoryCosts(attn_bytes_per_cell=1000.0)
    plan = plan_lanes(KvClass.DENSE, None, 512, costs=costs, memory_bytes=10_000_000)
    assert plan.n_ctx == 9984 and plan.total_bytes <= 10_000_000  # the largest multiple of 256 that fits
    assert plan.ceiling == 9984 // 128
    iswa = MemoryCosts(attn_bytes_per_cell=1000.0, swa_bytes_per_cell=1000.0, n_swa=512)
    both = plan_lanes(KvClass.ISWA, None, 512, costs=iswa, memory_bytes=10_000_000)
    assert both.total_bytes <= 10_000_000 and both.n_ctx < plan.n_ctx  # each lane also pays a window
    with pytest.raises(PlanError):
        plan_lanes(KvClass.DENSE, None, 512, costs=costs, memory_bytes=1000)
    with pytest.raises(PlanError):
        plan_lanes(KvClass.DENSE, 8192, 512, costs=costs, memory_bytes=1_000_000)  # the pool alone is over


# -- sampling rows ---------------------------------------------------------------------------


def test_sample_rows_matches_each_requests_own_sampler():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50)).astype(np.float32)
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_k=10, seed=1), SamplingParams(),
              SamplingParams(temperature=1.2, top_p=0.8, min_p=0.05, seed=2)]
    got = sample_rows(logits, [Sampler(p) for p in params])
    want = [Sampler(p)(logits[i]) for i, p in enumerate(params)]
    assert got.tolist() == want


def test_a_derived_pool_leaves_the_budget_room_for_its_own_lanes():
    """Maximising the pool alone would spend a hybrid's budget on cells and leave it one lane."""
    costs = MemoryCosts(attn_bytes_per_cell=1000.0, recurrent_bytes_per_seq=100_000.0)
    plan = plan_lanes(KvClass.SSM_HYBRID, None, 512, costs=costs, memory_bytes=10_000_000)
    assert "memory" not in plan.reason and plan.ceiling == (plan.n_ctx - plan.prefix_budget_tokens) // 128
    assert plan.total_bytes <= 10_000_000 and plan.ceiling > 1


async def test_a_request_cancelled_on_its_way_back_to_the_queue_still_finishes_once():
    """Its cancel reaches admission while the composer is requeueing it (nothing to remove), so
    admit() meets it cancelled at the head: it must still be counted and get its final event."""
    import trio

    from skippy.actors.admission import AdmissionActor
    from skippy.actors.messages import Requeue
    from skippy.scheduling.effects import Admit

    admission = Admission(ceiling=4, max_waiting=10)
    composer_tx, _composer_rx = trio.open_memory_channel(10)
    actor = AdmissionActor(admission, composer_tx)
    r = req(0)
    sink_tx, sink_rx = trio.open_memory_channel(10)
    r.sink = sink_tx
    r.state = RequestState.RUNNING  # preempted: the composer is sending it back
    r.cancel_requested = True
    actor.cancel(r)  # arrives first: not waiting, so nothing happens yet
    assert admission.cancelled == 0
    actor.ask(Requeue((r,)))
    assert actor.ask(Admit(Headroom.of(ledger(attn_free=100), [], 2))).requests == ()
    assert admission.cancelled == 1
    event = sink_rx.receive_nowait()
    assert event.final and event.finish_reason == "cancelled"
    actor.ask(Admit(Headroom.of(ledger(attn_free=100), [], 2)))
    assert admission.cancelled == 1  # once


def test_without_a_memory_budget_a_small_hybrids_states_do_not_cap_the_pools_ceiling():
    """Falcon-H1-0.5B's dims (12.3 MiB of state a sequence) over a 12288-cell pool: the pool's own
    ceiling decides, as llama-server -np 48 would run 48; a state 8x larger is capped by the states."""
    small = MemoryCosts(attn_bytes_per_cell=8192.0, recurrent_bytes_per_seq=12.3 * 2**20)
    plan = plan_lanes(KvClass.SSM_HYBRID, n_ctx=12288, n_batch=512, costs=small, reserved=8, prefix_fraction=0.5)
    assert plan.ceiling == (12288 - 6144) // 128 and "n_ctx" in plan.reason
    assert plan.bytes[ComponentKind.RECURRENT] == int(12.3 * 2**20 * (plan.ceiling + 8))
    big = attrs.evolve(small, recurrent_bytes_per_seq=8 * 12.3 * 2**20)
    capped = plan_lanes(KvClass.SSM_HYBRID, n_ctx=12288, n_batch=512, costs=big, reserved=8, prefix_fraction=0.5)
    assert capped.ceiling < plan.ceiling and "state budget" in capped.reason
