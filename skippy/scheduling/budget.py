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

Late streams (scheduling.slo: they can no longer meet a target) decode in the time the on-time
streams and prompts leave (`rows`), oldest first, at least LATE_LANES of them each step so each
one ends; with nothing on time running or waiting they all decode (nobody to protect), in steps of
LATE_STEP_TTFTS of a TTFT target, so late prompts go in large chunks and the backlog drains at batch
throughput rather than a TPOT target's worth a step (scheduling.slo.late_step_seconds). Beside
on-time work, a late row would otherwise lengthen every on-time stream's gap: at 1x capacity and
over, that made on-time arrivals late in turn (served at 1.5x: goodput 0.75x its 1x).
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs

from .cost import StepShape
from .requests import Request
from .slo import LATE_LANES, MARGIN, SloPolicy


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
                       start: int = 0, split: bool = False, prompts: int | None = None) -> int:
        """`waiting_on_time`: a prompt that can still make its first-token deadline waits for prefill.
        `start`: about where the prefill goes (its attention cost grows with the context). `split`: a chunk
        beside the decode rows is a ubatch of its own (recurrent memory); a chunk of `min_prefill` 1 is not.
        `prompts`: the prompts in flight, their tokens whole (what advisory targets spread, scheduling.slo)."""
        room = max(0, self.n_batch - len(decoding))
        if not decoding or self.slo is None:
            return room
        seconds = self.slo.step_seconds(decoding, now, waiting_on_time, prompts=prompts, n_batch=self.n_batch)
        if seconds == math.inf:
            return room
        allowed = self.slo.cost.prefill_for(seconds, self.slo.decode_shape(decoding), start, split)
        return min(room, max(self.min_prefill, allowed))

    def rows(self, decoding: list[Request], prefilling: Sequence[Request], now: float) -> list[Request]:
        """The decoding streams that get a token this step: every on-time one, and the late ones (oldest
        first) that fit the time left after them and the on-time prompts' share of prefill. With no late
        stream (every step but past capacity) `decoding` itself, not a copy: this runs every step."""
        slo = self.slo
        if slo is None or not any(r.late for r in decoding) or not slo.cost.calibrated:
            return decoding
        targets = slo.resolve()
        on = [r for r in decoding if not r.late]
        prompts = [r for r in prefilling if not r.late]
        if targets is None or not (on or prompts):
            return decoding
        late = sorted((r for r in decoding if r.late), key=lambda r: r.t_arrival)
        # banked slack only: headroom borrowed from tokens to come is for prompts that can still make it
        seconds = slo.step_seconds(on, now, bool(prompts), borrow=False) if on else math.inf
        want = min(sum(r.pending for r in prompts), max(0, self.n_batch - len(decoding)))
        if seconds == math.inf:  # on-time prompts and no on-time stream: late rows take no more than a target's step
            seconds = MARGIN * targets.tpot_s
        shape = slo.decode_shape(on)
        start = prompts[0].cached if prompts else 0
        p_on = min(want, max(self.min_prefill if want else 0, slo.cost.prefill_for(seconds, shape, start)))
        used = slo.cost.seconds(StepShape(len(on), p_on, shape.attended_kcells, 0))
        per_row = slo.cost.per_decode_row(sum(r.cached + 1 for r in late) / 1000.0 / len(late))
        k = int(max(0.0, seconds - used) / per_row)
        return on + late[: max(LATE_LANES, k)]
