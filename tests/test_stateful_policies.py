"""Hypothesis state machine over the engine's own step (scheduling.step), driven synchronously.

skippy.testing.SyncScheduler carries out each effect the step yields the way the owning actor
would, over a FakeRuntime, so every transition explored here is the engine's: admission,
composition, preemption, cancellation, prefix sharing (resident entries and running sources),
evict-and-retry, no-KV-slot recovery, requests that score their prompt (echo + logprobs, max_tokens 0
included) and n > 1 forks sharing their first choice's prompt. Memory taken by another tenant creates
the pressure.
Run over attention memory (any prefix shares) and recurrent state (whole states only).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from skippy.kv import ComponentKind
from skippy.scheduling import RequestState
from skippy.scheduling.admission import fcfs_priority, slo_order
from skippy.testing import FakeRuntime, SyncScheduler, chain

pytestmark = pytest.mark.stateful

CAPACITY = 160
CEILING = 6
SLOTS = 3
MAX_PREEMPTIONS = 2
PREFIXES = [[(7 * k + 3 * j) % 31 + 1 for k in range(40)] for j in range(3)]


class PolicyMachine(RuleBasedStateMachine):
    RECURRENT = True
    SLO: dict = {}  # latency targets (scheduling.slo); none: derived from the fake's simulated step costs

    def __init__(self) -> None:
        super().__init__()
        self.memory = FakeRuntime(n_ctx=CAPACITY, n_batch=24, n_seq_max=CEILING + SLOTS, n_vocab=32,
                                  recurrent=self.RECURRENT, eog_every=23, prefix=True)
        self.sim = SyncScheduler(self.memory, max_waiting=6, decode_reserve=3, max_preemptions=MAX_PREEMPTIONS,
                                 prefix_slots=SLOTS, prefix_budget_tokens=120, prefix_block=8, **self.SLO)
        self.tenant_took_memory = False

    @rule(ms=st.sampled_from([1, 5, 20, 100]))
    def time_passes(self, ms):
        """The clock moves with nothing computing (a client's think time): waiting requests age, and may
        become late."""
        self.memory.clock.advance(ms / 1000)

    @initialize(n=st.integers(2, 6), prompt_len=st.integers(8, 50), shared=st.booleans())
    def a_busy_start(self, n, prompt_len, shared):
        for i in range(n):
            self.submit(prompt_len + i, 40, 0, i + 1, 0 if shared else -1)

    @rule(prompt_len=st.integers(1, 60), max_tokens=st.integers(1, 40), priority=st.integers(0, 2),
          first=st.integers(1, 31), prefix=st.integers(-1, len(PREFIXES) - 1))
    def submit(self, prompt_len, max_tokens, priority, first, prefix):
        head = PREFIXES[prefix][: max(0, prompt_len - 4)] if prefix >= 0 else []
        prompt = head + [(first + 7 * i) % 31 + 1 for i in range(prompt_len - len(head))]
        self.sim.submit(prompt, min(max_tokens, CAPACITY - prompt_len), priority)

    @rule(prompt_len=st.integers(1, 50), max_tokens=st.integers(0, 12), first=st.integers(1, 31),
          prefix=st.integers(-1, len(PREFIXES) - 1))
    def submit_scoring(self, prompt_len, max_tokens, first, prefix):
        """echo + logprobs: every prompt row computed (never a shared prefix), scored once."""
        head = PREFIXES[prefix][: max(0, prompt_len - 4)] if prefix >= 0 else []
        prompt = head + [(first + 5 * i) % 31 + 1 for i in range(prompt_len - len(head))]
        self.sim.submit(prompt, max_tokens, prompt_logprobs=0, logprobs=0)

    @rule(n=st.integers(2, 3), prompt_len=st.integers(1, 40), max_tokens=st.integers(1, 20),
          first=st.integers(1, 31))
    def submit_forks(self, n, prompt_len, max_tokens, first):
        """n > 1: choices 1.. share choice 0's prompt cells once it has computed them."""
        prompt = [(first + 3 * i) % 31 + 1 for i in range(prompt_len)]
        parent = self.sim.submit(prompt, max_tokens)
        for i in range(1, n):
            self.sim.submit(prompt, max_tokens, fork_of=parent, choice=i)

    @rule(n=st.integers(1, 8))
    def step(self, n):
        for _ in range(n):
            self.sim.step()

    @precondition(lambda self: self.sim.requests)
    @rule(pick=st.integers(0, 10_000))
    def cancel(self, pick):
        self.sim.cancel(self.sim.requests[pick % len(self.sim.requests)])

    @rule(cells=st.integers(1, 80))
    def shrink_free_memory(self, cells):
        """Someone else takes free cells: pressure the scheduler must absorb (evict, then preempt)."""
        free = self.memory.ledger().get(ComponentKind.ATTN).free
        self.memory.hidden += min(cells, free)
        self.tenant_took_memory = True

    @rule()
    def restore_memory(self):
        self.memory.hidden = 0

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def cells_within_capacity(self):
        for c in self.memory.ledger().components:
            assert 0 <= c.used <= c.size, c

    @invariant()
    def every_request_in_exactly_one_place(self):
        waiting, running = self.sim.admission.waiting, self.sim.running
        assert len(set(map(id, waiting))) == len(waiting)
        assert len(set(map(id, running))) == len(running)
        for r in self.sim.requests:
            places = [r in waiting, r in running, r.state is RequestState.FINISHED,
                      r.state is RequestState.CANCELLED, r.state is RequestState.REJECTED]
            assert sum(places) == 1, (r, places)
            assert (r in waiting) == (r.state is RequestState.WAITING)
            assert (r in running) == (r.state is RequestState.RUNNING)

    @invariant()
    def lanes_are_owned_once(self):
        # running sequences, and finished ones whose release waits for the overlapped step still decoding them
        held = [r.seq_id for r in self.sim.running + self.sim.scheduler.holding]
        assert None not in held and len(set(held)) == len(held)
        assert len(held) + len(self.sim.admission.lanes) == self.sim.lanes.ceiling
        lanes = {s for s in self.memory.seqs if s < self.sim.lanes.ceiling}
        assert lanes <= set(held), (lanes, held)

    @invariant()
    def no_cell_is_lost_or_misplaced(self):
        """Every running sequence holds exactly its own tokens' cells; every entry its tokens'."""
        for r in self.sim.running:
            if r.share is None and not r.cancel_requested:  # cancelled: its last tokens are dropped, it goes next step
                assert self.memory.hashes(r.seq_id) == chain(r.token_slice(0, r.cached)), r.id
        for seq_id, entry in self.sim.scheduler.prefix.entries.items():
            assert self.memory.hashes(seq_id) == chain(entry.tokens), seq_id

    @invariant()
    def admission_follows_the_order(self):
        """Admission is strictly in the queue's order: every request an Admit round took comes before every
        fresh request it left waiting. Without targets that order is priority (lower first), then FCFS;
        with them (scheduling.slo) aged priority, on-time before late, then the first-token deadline."""
        if self.sim.last_admit is None:
            return
        admitted, waiting, gate = self.sim.last_admit
        key = fcfs_priority if gate is None else (lambda r: slo_order(r, gate.now))
        for r in admitted:
            for w in waiting:  # (a late request may be stepped over while the late lane is taken)
                if w.preemptions == 0 and not w.cancel_requested and not (gate is not None and w.late):
                    assert key(r) <= key(w), (r.id, key(r), w.id, key(w))

    @invariant()
    def steps_stay_within_n_batch(self):
        for report in self.sim.reports[-4:]:
            assert report.prefill_tokens + report.decode_tokens <= self.sim.runtime.n_batch

    @invariant()
    def streams_get_each_token_once_in_order(self):
        for r in self.sim.requests:
            got = self.sim.events[r.id]
            tokens = [e.token for e in got if e.token is not None]
            assert tokens == r.generated, r.id
            assert tokens == self.memory.solo(r.prompt.tolist(), r.max_tokens)[: len(tokens)], r.id
            assert [e.index for e in got if e.token is not None] == list(range(len(tokens)))
            finals = [e for e in got if e.final]
            ended = r.state in (RequestState.FINISHED, RequestState.CANCELLED) or shed(r)
            assert len(finals) == (1 if ended else 0), (r.id, r.state, finals)
            if r.logprobs is not None:
                assert all(e.logprob.token == e.token for e in got if e.token is not None), r.id
            scored = [e.prompt_logprobs for e in got if e.prompt_logprobs is not None]
            if r.prompt_logprobs is None:
                assert not scored
            else:
                assert r.shared_tokens == 0, r.id  # its prompt rows were computed, not shared
                assert len(scored) <= 1
                if tokens or (r.max_tokens == 0 and r.finish_reason == "length"):
                    assert got[0].prompt_logprobs is not None, r.id
                    assert [lp.token for lp in scored[0]] == r.prompt.tolist()[1:], r.id

    @invariant()
    def only_a_tenant_can_fail_a_request(self):
        if not self.tenant_took_memory:
            assert all(r.finish_reason != "error" for r in self.sim.requests if not shed(r))

    @invariant()
    def only_late_requests_are_shed_and_only_when_asked(self):
        for r in self.sim.requests:
            if shed(r):
                assert self.SLO.get("shed_late") and r.late and not r.generated and r.seq_id is None, r.id
        assert self.sim.stats().slo_shed == sum(map(shed, self.sim.requests))

    @invariant()
    def preemption_is_bounded(self):
        assert all(r.preemptions <= MAX_PREEMPTIONS for r in self.sim.requests)

    @invariant()
    def stats_agree_with_the_state(self):
        s = self.sim.stats()
        assert s.running == len(self.sim.running) and s.waiting == len(self.sim.admission.waiting)
        ended = sum(1 for r in self.sim.requests if r.state in (RequestState.FINISHED, RequestState.CANCELLED))
        assert sum(s.finished.values()) == ended
        # every request that finished with tokens is scored against the targets (once they are known: derived
        # ones resolve after the first steps)
        scored = sum(1 for r in self.sim.requests if r.finish_reason in ("stop", "length") and r.generated)
        assert s.slo_met + s.slo_missed == scored if self.SLO else s.slo_met + s.slo_missed <= scored
        assert s.submitted == sum(1 for r in self.sim.requests if r.state is not RequestState.REJECTED or shed(r))

    def teardown(self):
        """Once submissions stop (and the memory comes back), every request is admitted and finishes within
        a bounded number of steps: nothing starves, late or not, whatever the targets."""
        self.memory.hidden = 0
        self.sim.drain(max_steps=4000)
        assert not self.sim.admission.waiting and not self.sim.running
        for r in self.sim.requests:
            assert r.state in (RequestState.FINISHED, RequestState.CANCELLED, RequestState.REJECTED)
            if r.state is RequestState.FINISHED and r.finish_reason != "error":
                assert r.generated == self.memory.solo(r.prompt.tolist(), r.max_tokens)
        entries = self.sim.scheduler.prefix.entries
        attn = self.memory.ledger().get(ComponentKind.ATTN)
        assert attn.used == len({c for s in entries for c in self.memory.seqs.get(s, ())})  # only entries hold cells


def shed(r) -> bool:
    """Refused as late (shed_late) after it was queued: it got one final event with the error."""
    return r.state is RequestState.REJECTED and r.finish_reason == "error"


class AttentionPolicyMachine(PolicyMachine):
    RECURRENT = False


class TightTargetsMachine(PolicyMachine):
    """Targets the fake's steps can barely meet: streams and prompts go late, admission holds for the TPOT
    target, and late requests are still served (nothing dropped)."""

    RECURRENT = False
    SLO = {"ttft_slo_ms": 15.0, "tpot_slo_ms": 4.0}


class ShedLateMachine(PolicyMachine):
    """The same with `shed_late`: a request that can no longer make its first token in time is refused."""

    SLO = {"ttft_slo_ms": 15.0, "tpot_slo_ms": 4.0, "shed_late": True}


_settings = settings(max_examples=100, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
PolicyMachine.TestCase.settings = _settings
AttentionPolicyMachine.TestCase.settings = _settings
TightTargetsMachine.TestCase.settings = _settings
ShedLateMachine.TestCase.settings = _settings
test_policies_state_machine = PolicyMachine.TestCase
test_policies_state_machine_attention = AttentionPolicyMachine.TestCase
test_policies_state_machine_tight_targets = TightTargetsMachine.TestCase
test_policies_state_machine_shed_late = ShedLateMachine.TestCase
