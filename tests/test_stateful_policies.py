"""Hypothesis state machine over the pure policies (admission, composer, preemption) and a simulated ledger."""

from __future__ import annotations

import pytest
from _sim import SimScheduler
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from skippy.fake_runtime import FakeRuntime
from skippy.kv import ComponentKind
from skippy.scheduling import RequestState

pytestmark = pytest.mark.stateful

CAPACITY = 160
CEILING = 6
MAX_PREEMPTIONS = 2


class PolicyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.memory = FakeRuntime(n_ctx=CAPACITY, n_batch=24, n_seq_max=CEILING, n_vocab=32, recurrent=True, eog_every=23)
        self.sim = SimScheduler(self.memory, CEILING, max_waiting=6, decode_reserve=3, max_preemptions=MAX_PREEMPTIONS)

    @initialize(n=st.integers(2, 6), prompt_len=st.integers(8, 50))
    def a_busy_start(self, n, prompt_len):
        for i in range(n):
            self.submit(prompt_len + i, 40, 0, i + 1)

    @rule(prompt_len=st.integers(1, 60), max_tokens=st.integers(1, 40), priority=st.integers(0, 2),
          first=st.integers(1, 31))
    def submit(self, prompt_len, max_tokens, priority, first):
        prompt = [(first + 7 * i) % 31 + 1 for i in range(prompt_len)]
        self.sim.submit(prompt, min(max_tokens, CAPACITY - prompt_len), priority)

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
        """Someone else takes free cells: pressure the scheduler must absorb by preemption."""
        free = self.memory.ledger().get(ComponentKind.ATTN).free
        self.memory.hidden += min(cells, free)

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
        waiting, running = self.sim.admission.waiting, self.sim.composer.running
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
        held = [r.seq_id for r in self.sim.composer.running]
        assert None not in held and len(set(held)) == len(held)
        assert len(held) + len(self.sim.admission.lanes) == CEILING
        assert len(self.memory.seqs) <= CEILING
        for s, cells in self.memory.seqs.items():
            if cells:
                owner = [r for r in self.sim.composer.running if r.seq_id == s]
                assert len(owner) == 1 and owner[0].cached == len(cells), (s, owner)

    @invariant()
    def fcfs_among_equal_priority(self):
        log = self.sim.admission_log
        for i, r in enumerate(log):
            for q in log[i + 1 :]:
                if q.priority == r.priority:
                    assert q.arrival > r.arrival, (r, q)
        for r in log:  # nobody of the same priority that arrived earlier is still waiting, never admitted
            for w in self.sim.admission.waiting:
                if w.preemptions == 0 and w.priority == r.priority:
                    assert w.arrival > r.arrival, (r, w)

    @invariant()
    def no_token_lost_or_duplicated(self):
        for r in self.sim.requests:
            assert r.generated == self.memory.solo(r.prompt.tolist(), r.max_tokens)[: len(r.generated)], r.id

    @invariant()
    def preemption_is_bounded(self):
        assert all(r.preemptions <= MAX_PREEMPTIONS for r in self.sim.requests)

    def teardown(self):
        """Once submissions stop (and the memory comes back), every admitted request finishes."""
        self.memory.hidden = 0
        self.sim.drain()
        assert not self.sim.admission.waiting and not self.sim.composer.running
        for r in self.sim.requests:
            assert r.state in (RequestState.FINISHED, RequestState.CANCELLED, RequestState.REJECTED)
            if r.state is RequestState.FINISHED and r.finish_reason != "error":
                assert r.generated == self.memory.solo(r.prompt.tolist(), r.max_tokens)
        assert all(c.used == 0 for c in self.memory.ledger().components)


PolicyMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_policies_state_machine = PolicyMachine.TestCase
