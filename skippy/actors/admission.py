"""Admission actor: owns the waiting queue and the lanes; a thin loop over scheduling.Admission."""

from __future__ import annotations

import trio
from loguru import logger

from ..scheduling.admission import Admission
from ..scheduling.requests import Request, RequestState, TokenEvent
from ..telemetry import Counters
from ._mail import deliver, poke, reply
from .messages import AdmitQuery, Admitted, Cancel, Released, Requeue, Submit, Wake


class AdmissionActor:
    def __init__(
        self, policy: Admission, inbox: trio.MemoryReceiveChannel, composer: trio.MemorySendChannel, counters: Counters
    ) -> None:
        self.policy = policy
        self.inbox = inbox
        self.composer = composer
        self.counters = counters

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                self.handle(msg)

    def _finish_cancelled(self, r: Request) -> None:
        logger.debug("request {} cancelled while waiting", r.id)
        self.counters.finished["cancelled"] += 1
        self.counters.waiting = len(self.policy.waiting)
        deliver(r.sink, TokenEvent(None, "", len(r.generated), "cancelled", r.usage))

    def handle(self, msg: object) -> None:
        p = self.policy
        if isinstance(msg, AdmitQuery):
            admitted = p.admit(msg.headroom, msg.match)
            for r in p.take_cancelled():
                self._finish_cancelled(r)
            self.counters.admitted += len(admitted)
            self.counters.waiting = len(p.waiting)
            reply(msg.reply, Admitted(tuple(admitted), len(p.waiting), p.blocked))
        elif isinstance(msg, Submit):
            try:
                p.submit(msg.request)
            except Exception as exc:
                self.counters.rejected += 1
                reply(msg.reply, exc)
                return
            self.counters.submitted += 1
            self.counters.waiting = len(p.waiting)
            reply(msg.reply, None)
            poke(self.composer, Wake())
        elif isinstance(msg, Cancel):
            r = msg.request
            if p.cancel(r):
                self._finish_cancelled(r)
        elif isinstance(msg, Requeue):
            for r in msg.requests:
                p.requeue(r)
            self.counters.waiting = len(p.waiting)
            reply(msg.reply, None)
        elif isinstance(msg, Released):
            for s in msg.seq_ids:
                p.release(s)
            reply(msg.reply, None)
        else:  # pragma: no cover
            raise TypeError(f"Admission got {msg!r}")

    def abandon_all(self) -> None:
        """At shutdown: every waiting request ends as cancelled, so no consumer hangs."""
        for r in list(self.policy.waiting):
            self.policy.cancel(r)
            r.state = RequestState.CANCELLED
            deliver(r.sink, TokenEvent(None, "", len(r.generated), "cancelled", r.usage))
