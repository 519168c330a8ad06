"""The engine's own step, driven synchronously over a FakeRuntime: what the actors do, with no trio.

Each effect the step yields is carried out the way the actor that owns it would (the same
policy calls, in the same order), so a hypothesis machine that drives this explores the
engine's transitions, prefix sharing and recovery included, one step at a time.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from ..engine import EngineConfig, Policies, build_policies, policy_stats
from ..errors import OverloadedError
from ..scheduling.effects import (
    Admit, Collect, Decode, Deliver, FreeCells, Idle, Launch, Preempt, Preempted, ReadLedger, ReturnLanes,
    ShareCells, Shared, StepResult,
)
from ..scheduling.requests import Request, RequestState, TokenEvent, cancelled_event
from ..telemetry import EngineStats, StepReport
from ._fake_runtime import FakeRuntime
from ._lanes import fake_lanes


class SyncScheduler:
    """`step()` runs one engine step to its end; `events[request.id]` is what its stream received."""

    def __init__(self, runtime: FakeRuntime, **config: Any) -> None:
        self.runtime = runtime
        self.config = EngineConfig(**config)
        self.lanes = fake_lanes(runtime, self.config)
        self.policies: Policies = build_policies(runtime, self.config, self.lanes, clock=runtime.clock)
        self.requests: list[Request] = []
        self.events: dict[int, list[TokenEvent]] = {}
        self.event_times: dict[int, list[float]] = {}  # the fake clock at each event's delivery
        self.admission_log: list[Request] = []  # fresh admissions, in order
        self.reports: list[StepReport] = []
        self._ids = itertools.count()
        self._woken = True
        self._launched: list[tuple[int, Any]] = []  # (ticket, Launch) not yet run
        self._results: dict[int, StepResult] = {}
        self._last: StepResult | None = None
        self._tickets = itertools.count()
        self.launches = 0  # steps launched overlapped (chained decode)
        self.last_admit: tuple | None = None  # (admitted, still waiting, the SloGate or None) of the last Admit

    @property
    def admission(self):
        return self.policies.admission

    @property
    def scheduler(self):
        return self.policies.scheduler

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    # -- the client side, as Engine.generate and GenerationStream.cancel do it -----------------

    def submit(self, prompt: Sequence[int], max_tokens: int, priority: int = 0, **fields: Any) -> Request:
        rid = next(self._ids)
        fields.setdefault("t_arrival", self.runtime.clock())
        r = Request(rid, np.asarray(prompt, dtype=np.int32), max_tokens, priority=priority, arrival=rid, **fields)
        self.requests.append(r)
        self.events[rid] = []
        try:
            self.admission.submit(r)
        except OverloadedError:
            assert r.state is RequestState.REJECTED
        self._woken = True  # as the admission actor pokes the composer
        return r

    def cancel(self, r: Request) -> None:
        r.cancel_requested = True
        if self.admission.cancel(r):
            self._deliver(r, cancelled_event(r))
        self._woken = True

    def stats(self) -> EngineStats:
        return policy_stats(self.policies, self.lanes.ceiling)

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> StepReport | None:
        gen = self.scheduler.step(self._woken)
        self._woken = False
        answer = None
        while True:
            try:
                effect = gen.send(answer)
            except StopIteration as done:
                self.reports.extend(self.scheduler.take_reports())  # steps a run routed, if any
                if done.value is not None:
                    self.reports.append(done.value)
                return done.value
            answer = self._carry_out(effect)

    def _carry_out(self, effect: Any) -> Any:
        rt = self.runtime
        if isinstance(effect, Admit):
            answer, ended = self.admission.answer(effect)
            for r, event in ended:
                self._deliver(r, event)
            # what this round decided, for invariants on the order (tests/test_stateful_policies.py)
            self.last_admit = (answer.requests, tuple(self.admission.waiting), effect.slo)
            self.admission_log.extend(r for r in answer.requests if r.preemptions == 0)
            return answer
        if isinstance(effect, ReturnLanes):
            for s in effect.seq_ids:
                self.admission.release(s)
            return None
        if isinstance(effect, Preempt):
            victims = tuple(self.policies.preemption.preempt(effect.running, effect.missing, effect.at_least))
            ledger = self._free([v.seq_id for v in victims])
            for v in victims:
                self.admission.requeue(v)
            return Preempted(victims, ledger)
        if isinstance(effect, FreeCells):
            return self._free(effect.seq_ids)
        if isinstance(effect, ShareCells):
            return Shared(rt.share(effect.src, effect.dst, effect.length), rt.ledger())
        if isinstance(effect, (ReadLedger, Idle)):
            return rt.ledger()
        if isinstance(effect, Deliver):
            for e in effect.events:
                self._deliver(e.request, e.event)
            return None
        if isinstance(effect, Decode):
            return self._decode(effect)
        if isinstance(effect, Launch):  # runs when collected: memory changes between steps see it pending
            ticket = next(self._tickets)
            self._launched.append((ticket, effect))
            self.launches += 1
            return ticket
        if isinstance(effect, Collect):
            from ..actors.runtime_owner import run_launched

            while effect.ticket not in self._results:
                ticket, launch = self._launched.pop(0)
                self._last = self._results[ticket] = run_launched(self.runtime, launch, self._last)
            return self._results.pop(effect.ticket)
        raise TypeError(f"unknown effect {effect!r}")

    def _free(self, seq_ids: Sequence[int]):
        for s in seq_ids:
            self.runtime.seq_rm(s)
        return self.runtime.ledger()

    def _decode(self, d: Decode) -> StepResult:
        """As the RuntimeOwner: one step, or the error with the batch rolled back."""
        from ..actors.runtime_owner import execute

        return execute(self.runtime, d)

    def _deliver(self, r: Request, event: TokenEvent) -> None:
        self.event_times.setdefault(r.id, []).append(self.runtime.clock())
        got = self.events.setdefault(r.id, [])
        assert not (got and got[-1].final), f"request {r.id} got an event after its final one"
        got.append(event)

    def drain(self, max_steps: int = 20_000) -> None:
        """Step until nothing waits, runs or is in flight (every admitted request has finished)."""
        for _ in range(max_steps):
            self.step()
            if not self.admission.waiting and not self.running and self.scheduler.idle:
                return
        raise AssertionError("the scheduler did not drain")
