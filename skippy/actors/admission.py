"""Admission actor: owns the waiting queue and the lanes; a thin loop over scheduling.Admission."""

from __future__ import annotations

import trio
from loguru import logger

from ..scheduling.admission import Admission
from ..scheduling.effects import Admit, ReturnLanes
from ..scheduling.requests import cancelled_event
from ._mail import deliver, poke, reply
from .messages import Call, Cancel, Requeue, Submit, Wake


class AdmissionActor:
    def __init__(self, policy: Admission, inbox: trio.MemoryReceiveChannel, composer: trio.MemorySendChannel) -> None:
        self.policy = policy
        self.inbox = inbox
        self.composer = composer

    async def run(self) -> None:
        async with self.inbox:
            async for msg in self.inbox:
                self.handle(msg)

    def handle(self, msg: object) -> None:
        p = self.policy
        if isinstance(msg, Cancel):
            if p.cancel(msg.request):
                logger.debug("request {} cancelled while waiting", msg.request.id)
                deliver(msg.request.sink, cancelled_event(msg.request))
            return
        if not isinstance(msg, Call):  # pragma: no cover - a programming error, loudly
            raise TypeError(f"Admission got {msg!r}")
        what = msg.what
        if isinstance(what, Admit):
            answer, gone = p.answer(what)
            for r in gone:
                deliver(r.sink, cancelled_event(r))
            reply(msg.reply, answer)
        elif isinstance(what, Submit):
            try:
                p.submit(what.request)
            except Exception as exc:
                reply(msg.reply, exc)
                return
            reply(msg.reply, None)
            poke(self.composer, Wake())
        elif isinstance(what, Requeue):
            for r in what.requests:
                p.requeue(r)
            reply(msg.reply, None)
        elif isinstance(what, ReturnLanes):
            for s in what.seq_ids:
                p.release(s)
            reply(msg.reply, None)
        else:  # pragma: no cover
            raise TypeError(f"Admission got {what!r}")
