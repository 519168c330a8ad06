"""Preemption actor: picks victims (scheduling.Preemption), frees their cells, requeues them."""

from __future__ import annotations

from ..scheduling.effects import FreeCells, Preempt, Preempted
from ..scheduling.preemption import Preemption
from .admission import AdmissionActor
from .messages import Requeue
from .runtime_owner import RuntimeOwner


class PreemptionActor:
    """Victims, their cells and their place back in the queue, in that order. The composer asks
    directly; the peers it uses are asked directly too (all on one trio thread)."""

    def __init__(self, policy: Preemption, owner: RuntimeOwner, admission: AdmissionActor) -> None:
        self.policy = policy
        self.owner = owner
        self.admission = admission

    async def ask(self, p: Preempt) -> Preempted:
        victims = tuple(self.policy.preempt(p.running, p.missing, p.at_least))
        ledger = await self.owner.ask(FreeCells(tuple(v.seq_id for v in victims)))
        # requeue returns the lanes and resets the caches; once it is done the step drops
        # them from the running set, so a request is never seen in both places
        self.admission.ask(Requeue(victims))
        return Preempted(victims, ledger)
