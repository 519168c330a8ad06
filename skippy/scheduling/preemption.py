"""Victim choice under KV pressure: pure, no trio, no llama.

Preemption is by recompute: the victim's cells are freed and it returns to the head
of the waiting queue with its generated tokens. A request preempted `max_preemptions`
times is pinned: never chosen again, and re-admitted only with a reservation for all
of its remaining tokens, so its own growth can never cause pressure again. That bounds
repeated preemption of any one request (no starvation).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from loguru import logger

from ..kv import ComponentKind
from .requests import Request

VictimOrder = Callable[[Request], tuple]


def newest_first(request: Request) -> tuple:
    """Default: lowest priority (the highest value), then the most recently admitted."""
    return (-request.priority, -request.admitted_at)


def fewest_outputs_first(request: Request) -> tuple:
    """Least work lost to recompute: lowest priority, then fewest generated tokens, then newest."""
    return (-request.priority, len(request.generated), -request.admitted_at)


VICTIM_POLICIES: dict[str, VictimOrder] = {"newest": newest_first, "fewest_outputs": fewest_outputs_first}


def frees(request: Request) -> dict[ComponentKind, int]:
    """Cells given back by removing a request's sequence."""
    return {ComponentKind.ATTN: request.cached, ComponentKind.RECURRENT: 1 if request.cached else 0}


class Preemption:
    def __init__(self, order: VictimOrder | str = "newest", max_preemptions: int = 3) -> None:
        self.order = VICTIM_POLICIES[order] if isinstance(order, str) else order
        self.max_preemptions = max_preemptions
        self.total = 0  # victims so far

    def choose(
        self, running: Sequence[Request], missing: Mapping[ComponentKind, int], at_least: int = 1
    ) -> list[Request]:
        """Victims, in order, until the missing cells are covered (and at least `at_least` are taken).

        Pinned requests are skipped; if only pinned ones remain the result may fall short,
        and the caller shrinks the step instead.
        """
        candidates = sorted((r for r in running if not r.pinned), key=self.order)
        left = dict(missing)
        victims: list[Request] = []
        for r in candidates:
            if len(victims) >= at_least and all(v <= 0 for v in left.values()):
                break
            victims.append(r)
            for kind, n in frees(r).items():
                if kind in left:
                    left[kind] -= n
        return victims

    def preempt(
        self, running: Sequence[Request], missing: Mapping[ComponentKind, int], at_least: int = 1
    ) -> list[Request]:
        """Choose the victims and book them; the caller frees their cells and requeues them."""
        victims = self.choose(running, missing, at_least)
        for v in victims:
            self.preempted(v)
            logger.debug("preempting request {} (seq {}, {} generated, {} times)",
                         v.id, v.seq_id, len(v.generated), v.preemptions)
        return victims

    def preempted(self, request: Request) -> None:
        """Book-keeping for a victim on its way back to the queue."""
        self.total += 1
        request.preemptions += 1
        if request.preemptions >= self.max_preemptions:
            request.pinned = True
