"""Preemption actor: picks victims (scheduling.Preemption), frees their cells, requeues them."""

from __future__ import annotations

import trio
from loguru import logger

from ..telemetry import Counters
from ._mail import call, reply
from .messages import Preempted, Pressure, Release, Requeue
from ..scheduling.preemption import Preemption


class PreemptionActor:
    def __init__(
        self,
        policy: Preemption,
        inbox: trio.MemoryReceiveChannel,
        runtime: trio.MemorySendChannel,
        admission: trio.MemorySendChannel,
        counters: Counters,
    ) -> None:
        self.policy = policy
        self.inbox = inbox
        self.runtime = runtime
        self.admission = admission
        self.counters = counters

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                if not isinstance(msg, Pressure):  # pragma: no cover
                    raise TypeError(f"Preemption got {msg!r}")
                victims = self.policy.choose(msg.running, msg.missing, msg.at_least)
                ledger = await call(self.runtime, lambda r: Release(tuple(v.seq_id for v in victims), r))
                for v in victims:
                    self.policy.preempted(v)
                    logger.debug("preempted request {} (seq {}, {} generated, {} times)",
                                 v.id, v.seq_id, len(v.generated), v.preemptions)
                # requeue returns the lanes and resets the caches; once it is done the composer drops
                # them from the running set, so a request is never seen in both places
                await call(self.admission, lambda r: Requeue(tuple(victims), r))
                self.counters.preemptions += len(victims)
                reply(msg.reply, Preempted(tuple(victims), ledger))
