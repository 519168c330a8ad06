"""Preemption actor: picks victims (scheduling.Preemption), frees their cells, requeues them."""

from __future__ import annotations

import trio

from ..scheduling.effects import FreeCells, Preempt, Preempted
from ..scheduling.preemption import Preemption
from ._mail import reply
from .admission import AdmissionActor
from .messages import Call, Requeue
from .runtime_owner import RuntimeOwner


class PreemptionActor:
    """Victims, their cells and their place back in the queue, in that order. The composer asks
    directly; the peers it uses are asked directly too (all on one trio thread)."""

    def __init__(self, policy: Preemption, inbox: trio.MemoryReceiveChannel, owner: RuntimeOwner,
                 admission: AdmissionActor) -> None:
        self.policy = policy
        self.inbox = inbox
        self.owner = owner
        self.admission = admission

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                if not (isinstance(msg, Call) and isinstance(msg.what, Preempt)):  # pragma: no cover
                    raise TypeError(f"Preemption got {msg!r}")
                reply(msg.reply, await self.ask(msg.what))

    async def ask(self, p: Preempt) -> Preempted:
        victims = tuple(self.policy.preempt(p.running, p.missing, p.at_least))
        ledger = await self.owner.ask(FreeCells(tuple(v.seq_id for v in victims)))
        # requeue returns the lanes and resets the caches; once it is done the step drops
        # them from the running set, so a request is never seen in both places
        self.admission.ask(Requeue(victims))
        return Preempted(victims, ledger)
