"""Admission actor: owns the waiting queue and the lanes; a thin shell over scheduling.Admission.

Everything it is told happens on the trio thread: submissions and cancels come straight from
the Engine, the composer's questions straight from the step. No inbox: nothing else asks it."""

from __future__ import annotations

import trio
from loguru import logger

from ..scheduling.admission import Admission
from ..scheduling.effects import Admit, ReturnLanes
from ..scheduling.requests import Request, cancelled_event
from ._mail import deliver, poke, reply
from .messages import Requeue, Wake


class AdmissionActor:
    def __init__(self, policy: Admission, composer: trio.MemorySendChannel) -> None:
        self.policy = policy
        self.composer = composer

    def ask(self, what: object) -> object:
        """The composer's questions, answered directly (same trio thread): Admit, ReturnLanes, Requeue."""
        p = self.policy
        if isinstance(what, Admit):
            answer, ended = p.answer(what)
            for r, event in ended:
                deliver(r.sink, event)
            return answer
        if isinstance(what, Requeue):
            for r in what.requests:
                p.requeue(r)
            return None
        if isinstance(what, ReturnLanes):
            for s in what.seq_ids:
                p.release(s)
            return None
        raise TypeError(f"Admission got {what!r}")  # pragma: no cover

    def submit(self, request: Request, answer: trio.MemorySendChannel) -> None:
        """A new request (from Engine.generate, on the trio thread): queued, or refused through `answer`."""
        try:
            self.policy.submit(request)
        except Exception as exc:
            reply(answer, exc)
            return
        reply(answer, None)
        poke(self.composer, Wake())

    def cancel(self, request: Request) -> None:
        """The caller left: a waiting request ends here; a running one is swept by the step."""
        if self.policy.cancel(request):
            logger.debug("request {} cancelled while waiting", request.id)
            deliver(request.sink, cancelled_event(request))
