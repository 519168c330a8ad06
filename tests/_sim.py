"""A synchronous scheduler over the pure policies and a simulated memory (FakeRuntime used as a ledger).

It wires admission, composer and preemption the way the actors do, with no trio, so
hypothesis can drive the policies step by step and check invariants between steps.
"""

from __future__ import annotations

import itertools

import numpy as np

from skippy.errors import NoKvSlotError, OverloadedError
from skippy.fake_runtime import FakeRuntime
from skippy.kv import ComponentKind
from skippy.runtime import sample_rows
from skippy.scheduling import Admission, Composer, Headroom, Preemption, Request, RequestState
from skippy.scheduling.memory import shortfall, step_need

ATTN = ComponentKind.ATTN


class SimScheduler:
    def __init__(self, memory: FakeRuntime, ceiling: int, max_waiting: int = 8, decode_reserve: int = 4,
                 max_preemptions: int = 2, victims: str = "newest") -> None:
        self.memory = memory
        self.admission = Admission(ceiling, max_waiting, decode_reserve)
        self.composer = Composer(memory.n_batch)
        self.preemption = Preemption(victims, max_preemptions)
        self.decode_reserve = decode_reserve
        self.requests: list[Request] = []
        self.admission_log: list[Request] = []  # fresh admissions, in order
        self.steps = 0
        self.preempted_last = False
        self._ids = itertools.count()

    # -- client side ----------------------------------------------------------------

    def submit(self, prompt: list[int], max_tokens: int, priority: int = 0) -> Request:
        rid = next(self._ids)
        r = Request(rid, np.asarray(prompt, dtype=np.int32), max_tokens, priority=priority, arrival=rid)
        self.requests.append(r)
        try:
            self.admission.submit(r)
        except OverloadedError:
            assert r.state is RequestState.REJECTED
        return r

    def cancel(self, r: Request) -> None:
        r.cancel_requested = True
        self.admission.cancel(r)

    # -- one step, as the composer actor runs it ---------------------------------------

    def _release(self, requests) -> None:
        for r in requests:
            if r.seq_id is not None:
                self.memory.seq_rm(r.seq_id)
                self.admission.release(r.seq_id)
                r.seq_id = None

    def _relieve(self, missing, at_least=0) -> list[Request]:
        if not missing and not at_least:
            return []
        victims = self.preemption.choose(self.composer.running, missing, at_least)
        for v in victims:
            self.memory.seq_rm(v.seq_id)
            self.preemption.preempted(v)
            self.composer.remove(v)
            self.admission.requeue(v)
        return victims

    def _decode_shortfall(self):
        decoding = sum(1 for r in self.composer.running if r.pending == 1)
        return shortfall(self.memory.ledger(), step_need(decoding, 0))

    def _attn_free(self) -> int:
        return self.memory.ledger().get(ATTN).free

    def step(self) -> bool:
        """One scheduler iteration; False when there was nothing to run."""
        gone = self.composer.cancelled()
        for r in gone:
            self.composer.end(r, "cancelled")
        self._release(gone)
        victims = self._relieve(self._decode_shortfall())
        queried = not victims and not self.preempted_last
        if queried:
            headroom = Headroom.of(self.memory.ledger(), self.composer.running, self.decode_reserve)
            admitted = self.admission.admit(headroom)
            self.admission_log.extend(r for r in admitted if r.preemptions == 0)
            self.composer.add(admitted)
        plan = self.composer.compose(self._attn_free())
        stuck = plan.n_tokens == 0 and bool(self.composer.running)
        if plan.starved or stuck or shortfall(self.memory.ledger(), step_need(plan.n_tokens, plan.new_sequences)):
            victims += self._relieve(self._decode_shortfall() or {ATTN: plan.starved}, at_least=1)
            plan = self.composer.compose(self._attn_free())
        self.preempted_last = bool(victims)
        if plan.n_tokens == 0:
            if victims or not queried:
                return True
            if self.composer.running:
                failed = self.composer.running[-1:]
                for r in failed:
                    self.composer.end(r, "error")
                self._release(failed)
                return True
            return False
        try:
            logits = self.memory.decode(plan.tokens, plan.positions, plan.seq_ids, plan.outputs)
        except NoKvSlotError:  # pragma: no cover - the policies never compose a step that does not fit
            raise AssertionError("composed a step that does not fit the memory")
        rows = plan.output_requests
        tokens = sample_rows(logits, [r.sampler for r in rows])
        pieces = [self.memory.piece(t) for t in tokens]
        eog = [self.memory.is_eog(t) for t in tokens]
        _, finished = self.composer.apply(plan, tokens, pieces, eog)
        self._release(finished)
        self.steps += 1
        return True

    def drain(self, max_steps: int = 20_000) -> None:
        for _ in range(max_steps):
            if not self.step() and not self.admission.waiting and not self.composer.running:
                return
        raise AssertionError("the scheduler did not drain")
