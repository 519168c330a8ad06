"""The step token budget: how much prefill may join a step that carries decodes. Pure.

Every running stream waits for the step its next token is in, so a step's time is every
stream's inter-token gap. The budget gives a step the time its on-time streams can spare
before their next token is due (scheduling.slo: the least slack, capped) and fills it with as
many prompt tokens as the step-cost model (scheduling.cost) says fit beside the decode rows. A
step with no decodes stalls nobody and takes the whole n_batch. With no target resolved yet
(nothing measured), steps fill n_batch too.

A step whose decodes already take all the time still moves prompts by `min_prefill` tokens
(default 1), so a prompt is never parked behind a stream for good: its first-token deadline is
what decides whether it becomes late, not the budget.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs

from .cost import StepShape
from .requests import Request
from .slo import SloPolicy


@attrs.define
class TokenBudget:
    """How many prefill tokens a step with these decoding streams may take."""

    n_batch: int
    slo: SloPolicy | None = attrs.field(factory=SloPolicy)  # None: no budget (every step may fill n_batch)
    min_prefill: int = 1

    @property
    def cost(self):
        return self.slo.cost if self.slo is not None else None

    def observe(self, shape: StepShape, seconds: float) -> None:
        if self.slo is not None:
            self.slo.cost.observe(shape, seconds)

    def prefill_tokens(self, decoding: Sequence[Request], now: float, waiting_on_time: bool = False,
                       start: int = 0) -> int:
        """`waiting_on_time`: a prompt that can still make its first-token deadline waits for prefill.
        `start`: about where the prefill goes (its attention cost grows with the context)."""
        room = max(0, self.n_batch - len(decoding))
        if not decoding or self.slo is None:
            return room
        seconds = self.slo.step_seconds(decoding, now, waiting_on_time)
        if seconds == math.inf:
            return room
        allowed = self.slo.cost.prefill_for(seconds, self.slo.decode_shape(decoding), start)
        return min(room, max(self.min_prefill, allowed))
