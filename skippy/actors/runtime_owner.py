"""RuntimeOwner: the only holder of the runtime (model, context, memory); serialises every llama call.

Each Decode is one step of the mixed batch (decode_sample: the decode plus sampling), run on the worker thread
so the event loop keeps serving while it computes. Logits are a view valid only
until the next decode, so sampling happens right after, in the same job.
"""

from __future__ import annotations

import time

import numpy as np
import trio
from loguru import logger

from ..errors import NoKvSlotError
from ..kv import Ledger
from ..runtime import Runtime
from ..scheduling.effects import Decode, FreeCells, ReadLedger, ShareCells, Shared, StepResult
from ._mail import reply
from .messages import Call
from .worker import Worker


class RuntimeOwner:
    def __init__(self, runtime: Runtime, worker: Worker, inbox: trio.MemoryReceiveChannel) -> None:
        self.runtime = runtime
        self.worker = worker
        self.inbox = inbox

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                if not isinstance(msg, Call):  # pragma: no cover - a programming error, loudly
                    raise TypeError(f"RuntimeOwner got {msg!r}")
                what = msg.what
                if isinstance(what, Decode):
                    result = await self.worker.run(lambda: execute(self.runtime, what), on_cancel=self.runtime.abort)
                    reply(msg.reply, result)
                elif isinstance(what, FreeCells):
                    reply(msg.reply, self._free(what.seq_ids))
                elif isinstance(what, ShareCells):
                    granted = self.runtime.share(what.src, what.dst, what.length)
                    reply(msg.reply, Shared(granted, self.runtime.ledger()))
                elif isinstance(what, ReadLedger):
                    reply(msg.reply, self.runtime.ledger())
                else:  # pragma: no cover
                    raise TypeError(f"RuntimeOwner got {what!r}")

    def _free(self, seq_ids: tuple[int, ...]) -> Ledger:
        for s in seq_ids:
            self.runtime.seq_rm(s)
        return self.runtime.ledger()



def execute(rt: Runtime, step: Decode) -> StepResult:
    """One step on the runtime: its tokens, pieces and end-of-generation flags, or the error with
    nothing of the batch left in memory (what could not be rolled back is reported lost)."""
    plan = step.plan
    t0 = time.perf_counter()
    try:
        sampled = rt.decode_sample(plan.tokens, plan.positions, plan.seq_ids, plan.outputs, step.samplers)
    except NoKvSlotError as exc:
        return StepResult(rt.ledger(), error=exc, lost=_rollback(rt, plan))
    except Exception as exc:
        logger.warning("step failed: {!r}", exc)
        return StepResult(rt.ledger(), error=exc)
    try:
        ids = sampled.tokens.tolist()
        pieces = tuple(rt.piece(t) for t in ids)
        eog = tuple(rt.is_eog(t) for t in ids)
    except Exception as exc:
        logger.warning("step failed in detokenizing: {!r}", exc)
        return StepResult(rt.ledger(), error=exc)
    return StepResult(rt.ledger(), sampled.tokens, pieces, eog, sampled.t_decode,
                      time.perf_counter() - t0 - sampled.t_decode)  # sampling + detokenizing


def _rollback(rt: Runtime, plan) -> tuple[int, ...]:
    """After a failed decode, make sure no sequence keeps part of the batch."""
    lost = []
    for s in np.unique(plan.seq_ids).tolist():
        first = int(plan.positions[plan.seq_ids == s].min())
        if not rt.seq_rm(s, first, -1):
            rt.seq_rm(s)
            lost.append(s)
    return tuple(lost)
