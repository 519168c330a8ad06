"""Composer actor: drives the step (scheduling.step.StepScheduler) over the other actors.

The step is a generator of effects; each becomes one call to the actor that owns the
resource (admission: the queue and lanes; preemption: victims; the runtime owner: the
context), or is done here (delivering events, waiting while idle). Nothing is decided here.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Generator

import trio

from ..scheduling.effects import Admit, Deliver, Idle, Preempt, ReadLedger, ReturnLanes
from ..scheduling.step import StepScheduler
from ..telemetry import StepReport
from ._mail import call, deliver


class ComposerActor:
    def __init__(
        self,
        scheduler: StepScheduler,
        inbox: trio.MemoryReceiveChannel,
        runtime: trio.MemorySendChannel,
        admission: trio.MemorySendChannel,
        preemption: trio.MemorySendChannel,
        on_step: Callable[[StepReport], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.inbox = inbox
        self.runtime = runtime
        self.admission = admission
        self.preemption = preemption
        self.on_step = on_step

    async def run(self) -> None:
        async with self.inbox:
            while True:
                self._drain()  # wake-ups that arrived while stepping: this step sees their cause
                report = await self._drive(self.scheduler.step())
                if report is not None and self.on_step is not None:
                    self.on_step(report)

    def _drain(self) -> None:
        while True:
            try:
                self.inbox.receive_nowait()
            except trio.WouldBlock:
                return

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
            with trio.move_on_after(math.inf if effect.poll is None else effect.poll):
                await self.inbox.receive()
            return await call(self.runtime, ReadLedger())
        if isinstance(effect, (Admit, ReturnLanes)):
            return await call(self.admission, effect)
        if isinstance(effect, Preempt):
            return await call(self.preemption, effect)
        return await call(self.runtime, effect)  # Decode, FreeCells, ShareCells
