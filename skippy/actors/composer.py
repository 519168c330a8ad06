"""Composer actor: drives the step (scheduling.step.StepScheduler) over the other actors.

The step is a generator of effects; each becomes one ask of the actor that owns the
resource (admission: the queue and lanes; preemption: victims; the runtime owner: the
context), or is done here (delivering events, waiting while idle). Nothing is decided here.
The asks are direct calls, not channel round trips: every actor lives on the same trio
thread and owns its state; the owner serialises the runtime with a lock. Channels carry
what comes from outside the step (submissions, cancels, wake-ups).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Generator

import trio

from ..scheduling.effects import Admit, Collect, Deliver, Idle, Preempt, ReadLedger, ReturnLanes
from ..scheduling.step import StepScheduler
from ..telemetry import StepReport
from ._mail import deliver
from .admission import AdmissionActor
from .preemption import PreemptionActor
from .runtime_owner import RuntimeOwner


class ComposerActor:
    def __init__(
        self,
        scheduler: StepScheduler,
        inbox: trio.MemoryReceiveChannel,
        runtime: RuntimeOwner,
        admission: AdmissionActor,
        preemption: PreemptionActor,
        on_step: Callable[[StepReport], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.inbox = inbox
        self.runtime = runtime
        self.admission = admission
        self.preemption = preemption
        self.on_step = on_step
        self.parked = trio.Event()  # set while waiting for work with nothing queued, running or held
        self._mail_in_run = False  # a wake-up came (and was taken) while a run was out

    async def run(self) -> None:
        async with self.inbox:
            while True:
                woken = self._drain()  # wake-ups that arrived while stepping: this step sees their cause
                report = await self._drive(self.scheduler.step(woken))
                ran = self.scheduler.take_reports()  # steps a run routed, before `report`
                if self.on_step is not None:
                    for r in ran:
                        self.on_step(r)
                if report is None:  # no decode ran (the step's one yield point): let the others run
                    self.runtime.run_deferred()
                    await trio.lowlevel.checkpoint()
                elif self.on_step is not None:
                    self.on_step(report)

    def unpark(self) -> None:
        """Work arrived: not parked any more, even before this actor runs to see it."""
        if self.parked.is_set():
            self.parked = trio.Event()

    async def _collect_run(self, effect: Collect) -> Any:
        """A run goes on until it is collected: a wake-up (an arrival, a cancel) while it is out stops it
        after the decode it is in, so the step sees the cause no later than a chained step would."""

        async def stop_on_mail() -> None:
            try:
                await self.inbox.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):  # closing: the run ends all the same
                pass
            self._mail_in_run = True
            effect.run.stop.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_mail)
            try:
                return await self.runtime.ask(effect)
            finally:
                nursery.cancel_scope.cancel()

    def _drain(self) -> bool:
        woken, self._mail_in_run = self._mail_in_run, False
        while True:
            try:
                self.inbox.receive_nowait()
            except trio.WouldBlock:
                return woken
            woken = True

    async def _drive(self, step: Generator[Any, Any, StepReport | None]) -> StepReport | None:
        answer = None
        while True:
            try:
                effect = step.send(answer)
            except StopIteration as done:
                return done.value
            answer = await self._carry_out(effect)

    async def _carry_out(self, effect: Any) -> Any:
        if isinstance(effect, Deliver):
            for e in effect.events:
                deliver(e.request.sink, e.event)
            return None
        if isinstance(effect, Idle):  # wait for a submission or cancellation, or poll
            self.runtime.run_deferred()  # no step to overlap: now
            if effect.poll is None:
                self.parked.set()
            with trio.move_on_after(math.inf if effect.poll is None else effect.poll):
                await self.inbox.receive()
            self.unpark()
            return await self.runtime.ask(ReadLedger())
        if isinstance(effect, Collect) and effect.run is not None:
            return await self._collect_run(effect)
        if isinstance(effect, (Admit, ReturnLanes)):
            return self.admission.ask(effect)
        if isinstance(effect, Preempt):
            return await self.preemption.ask(effect)
        return await self.runtime.ask(effect)  # Decode, FreeCells, ShareCells
