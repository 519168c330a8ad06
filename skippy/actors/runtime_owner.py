"""RuntimeOwner: the only holder of the runtime (model, context, memory); serialises every llama call.

Each Step is one decode of the mixed batch plus sampling, run on the worker thread
so the event loop keeps serving while it computes. Logits are a view valid only
until the next decode, so sampling happens right after, in the same job.
"""

from __future__ import annotations

import time

import numpy as np
import trio
from loguru import logger

from ..errors import NoKvSlotError
from ..runtime import Runtime, sample_rows
from ._mail import reply
from .messages import LedgerQuery, Release, ShareCells, Shared, Step, StepResult
from .worker import Worker


class RuntimeOwner:
    def __init__(self, runtime: Runtime, worker: Worker, inbox: trio.MemoryReceiveChannel) -> None:
        self.runtime = runtime
        self.worker = worker
        self.inbox = inbox

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                if isinstance(msg, Step):
                    result = await self.worker.run(lambda: self._execute(msg), on_cancel=self.runtime.abort)
                    reply(msg.reply, result)
                elif isinstance(msg, Release):
                    reply(msg.reply, self._release(msg.seq_ids))
                elif isinstance(msg, ShareCells):
                    granted = self.runtime.share(msg.src, msg.dst, msg.length)
                    reply(msg.reply, Shared(granted, self.runtime.ledger()))
                elif isinstance(msg, LedgerQuery):
                    reply(msg.reply, self.runtime.ledger())
                else:  # pragma: no cover - a programming error, loudly
                    raise TypeError(f"RuntimeOwner got {msg!r}")

    def _release(self, seq_ids: tuple[int, ...]):
        for s in seq_ids:
            self.runtime.seq_rm(s)
        return self.runtime.ledger()

    def _execute(self, step: Step) -> StepResult:
        rt, plan = self.runtime, step.plan
        t0 = time.perf_counter()
        remote = getattr(rt, "decode_sample", None)  # a pipeline: its last stage samples
        try:
            if remote is not None:
                tokens = remote(plan.tokens, plan.positions, plan.seq_ids, plan.outputs, step.samplers)
            else:
                logits = rt.decode(plan.tokens, plan.positions, plan.seq_ids, plan.outputs)
        except NoKvSlotError as exc:
            return StepResult(rt.ledger(), error=exc, lost=self._rollback(plan))
        except Exception as exc:
            logger.warning("step failed in decode: {!r}", exc)
            return StepResult(rt.ledger(), error=exc)
        t1 = time.perf_counter()
        try:
            if remote is None:
                tokens = sample_rows(logits, step.samplers)
            pieces = tuple(rt.piece(t) for t in tokens.tolist())
            eog = tuple(rt.is_eog(t) for t in tokens.tolist())
        except Exception as exc:
            logger.warning("step failed in sampling: {!r}", exc)
            return StepResult(rt.ledger(), error=exc)
        t2 = time.perf_counter()
        return StepResult(rt.ledger(), tokens, pieces, eog, t1 - t0, t2 - t1)

    def _rollback(self, plan) -> tuple[int, ...]:
        """After a failed decode, make sure no sequence keeps part of the batch."""
        lost = []
        for s in np.unique(plan.seq_ids).tolist():
            first = int(plan.positions[plan.seq_ids == s].min())
            if not self.runtime.seq_rm(s, first, -1):
                self.runtime.seq_rm(s)
                lost.append(s)
        return tuple(lost)
