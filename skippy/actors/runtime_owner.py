"""RuntimeOwner: the only holder of the runtime (model, context, memory); serialises every llama call.

Each Decode is one step of the mixed batch (decode_sample: the decode plus sampling), run on the worker thread
so the event loop keeps serving while it computes. Logits are a view valid only
until the next decode, so sampling happens right after, in the same job.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

import numpy as np
import trio
from loguru import logger

from ..errors import NoKvSlotError, SchedulerInvariantError
from ..runtime import Runtime
from ..scheduling.effects import Collect, Decode, FreeCells, Launch, ReadLedger, ShareCells, Shared, StepResult
from ..scheduling.run_ahead import RunAhead, RunResult, run_steps
from ._mail import reply
from .messages import Call
from .worker import Job, Worker


class RuntimeOwner:
    """The one object that touches the runtime. `ask` serialises every use (a trio lock: a decode
    in the worker thread and a seq_rm never overlap); the composer asks directly (same trio
    thread, no hop), anything else through the inbox."""

    def __init__(self, runtime: Runtime, worker: Worker, inbox: trio.MemoryReceiveChannel) -> None:
        self.runtime = runtime
        self.worker = worker
        self.inbox = inbox
        self._lock = trio.Lock()
        self._launched: list[Job] = []  # steps started and not yet collected (they hold the lock)
        self._last: StepResult | None = None  # the last launched step's result (worker thread only)
        self._deferred: list[Callable[[], None]] = []  # run once the next step is in the worker's hands

    @property
    def computing(self) -> bool:
        """A launched step is in the worker's hands (chained decoding): work done now overlaps it."""
        return bool(self._launched)

    def after_next_start(self, fn: Callable[[], None]) -> None:
        """Run `fn` once, right after the next step is handed to the worker thread (or before the
        composer yields without one): sync work that should overlap the decode, not delay it."""
        self._deferred.append(fn)

    def run_deferred(self) -> None:
        fns, self._deferred = self._deferred, []
        for fn in fns:
            try:
                fn()
            except Exception:  # a caller's bug must not take the step loop down
                logger.opt(exception=True).error("work deferred to the next step's start failed")

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                if not isinstance(msg, Call):  # pragma: no cover - a programming error, loudly
                    raise TypeError(f"RuntimeOwner got {msg!r}")
                reply(msg.reply, await self.ask(msg.what))

    async def ask(self, what: object) -> object:
        if isinstance(what, Launch):
            if not self._launched:
                await self._acquire()
            job = self.worker.start(partial(self._run_launched, what))
            self._launched.append(job)
            self.run_deferred()
            return job
        if isinstance(what, Collect):
            try:
                return await what.ticket.result(self.runtime.abort if what.run is None else partial(
                    _abort_run, what.run, self.runtime))
            finally:
                self._launched.remove(what.ticket)
                if not self._launched:
                    self._lock.release()
        if self._launched and self._lock.statistics().owner is trio.lowlevel.current_task():
            raise SchedulerInvariantError(f"{type(what).__name__} asked while the asker's launched step is in flight")
        await self._acquire()
        try:
            if isinstance(what, Decode):
                job = self.worker.start(lambda: execute(self.runtime, what))
                self.run_deferred()
                return await job.result(self.runtime.abort)
            if isinstance(what, FreeCells):
                for s in what.seq_ids:
                    self.runtime.seq_rm(s)
                return self.runtime.ledger()
            if isinstance(what, ShareCells):
                granted = self.runtime.share(what.src, what.dst, what.length)
                return Shared(granted, self.runtime.ledger())
            if isinstance(what, ReadLedger):
                return self.runtime.ledger()
        finally:
            self._lock.release()
        raise TypeError(f"RuntimeOwner got {what!r}")  # pragma: no cover

    async def _acquire(self) -> None:
        # without a checkpoint when the lock is free: the decode must reach the worker thread before
        # any other task runs (streams writing the last step's tokens run while it computes)
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    def _run_launched(self, launch: Launch) -> StepResult | RunResult:  # on the worker thread, in launch order
        result = run_launched(self.runtime, launch, self._last)
        self._last = result.steps[-1][1] if isinstance(result, RunResult) else result
        return result


def run_launched(rt: Runtime, launch: Launch, before: StepResult | None) -> StepResult | RunResult:
    """A launched step: a chained one takes the tokens the step before it sampled, or is skipped
    (nothing runs, nothing changes) when that one did not complete. A run goes on from there
    (scheduling.run_ahead)."""
    if launch.run is not None:
        return run_steps(launch, before, partial(run_launched, rt))
    if launch.chained:
        if before is None or before.error is not None or before.skipped or before.tokens is None:
            return StepResult(rt.ledger(), skipped=True)
        launch.plan.tokens[:] = before.tokens
    return execute(rt, Decode(launch.plan, launch.samplers))


def execute(rt: Runtime, step: Decode) -> StepResult:
    """One step on the runtime: its tokens, pieces and end-of-generation flags, or the error with
    nothing of the batch left in memory (what could not be rolled back is reported lost)."""
    plan = step.plan
    t0 = time.perf_counter()
    try:
        if plan.rows is None:
            sampled = rt.decode_sample(plan.tokens, plan.positions, plan.seq_ids, plan.outputs, step.samplers)
        else:  # a request asked for logprobs: the runtime computes them where the rows are
            sampled = rt.decode_sample(plan.tokens, plan.positions, plan.seq_ids, plan.outputs, step.samplers,
                                       rows=plan.rows)
    except NoKvSlotError as exc:
        return StepResult(rt.ledger(), error=exc, lost=_rollback(rt, plan))
    except Exception as exc:
        logger.warning("step failed: {!r}", exc)
        return StepResult(rt.ledger(), error=exc)
    t_sampled = time.perf_counter()
    try:
        ids = sampled.tokens.tolist()
        pieces = tuple(rt.piece(t) for t in ids)
        eog = tuple(rt.is_eog(t) for t in ids)
    except Exception as exc:
        logger.warning("step failed in detokenizing: {!r}", exc)
        return StepResult(rt.ledger(), error=exc)
    return StepResult(rt.ledger(), sampled.tokens, pieces, eog, sampled.t_decode,
                      max(0.0, time.perf_counter() - t0 - sampled.t_decode),  # sampling + detokenizing (0 when
                      # a runtime reports simulated decode time, as skippy.testing's fake does)
                      t_sampled=t_sampled, logprobs=sampled.logprobs)


def _abort_run(run: RunAhead, rt: Runtime) -> None:
    """A cancelled collector: the run ends after this decode (aborted too) and routes nothing."""
    run.stop.set()
    run.ready.set()
    rt.abort()


def _rollback(rt: Runtime, plan) -> tuple[int, ...]:
    """After a failed decode, make sure no sequence keeps part of the batch."""
    lost = []
    for s in np.unique(plan.seq_ids).tolist():
        first = int(plan.positions[plan.seq_ids == s].min())
        if not rt.seq_rm(s, first, -1):
            rt.seq_rm(s)
            lost.append(s)
    return tuple(lost)
