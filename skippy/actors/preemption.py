"""Preemption actor: picks victims (scheduling.Preemption), frees their cells, requeues them."""

from __future__ import annotations

import trio

from ..scheduling.effects import FreeCells, Preempt, Preempted
from ..scheduling.preemption import Preemption
from ._mail import call, reply
from .messages import Call, Requeue


class PreemptionActor:
    def __init__(self, policy: Preemption, inbox: trio.MemoryReceiveChannel, runtime: trio.MemorySendChannel,
                 admission: trio.MemorySendChannel) -> None:
        self.policy = policy
        self.inbox = inbox
        self.runtime = runtime
        self.admission = admission

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                if not (isinstance(msg, Call) and isinstance(msg.what, Preempt)):  # pragma: no cover
                    raise TypeError(f"Preemption got {msg!r}")
                p = msg.what
                victims = tuple(self.policy.preempt(p.running, p.missing, p.at_least))
                ledger = await call(self.runtime, FreeCells(tuple(v.seq_id for v in victims)))
                # requeue returns the lanes and resets the caches; once it is done the step drops
                # them from the running set, so a request is never seen in both places
                await call(self.admission, Requeue(victims))
                reply(msg.reply, Preempted(victims, ledger))
