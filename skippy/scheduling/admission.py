"""The waiting queue and the admission decision: pure, no trio, no llama.

Order: preempted requests first (they already waited once), then by priority,
then FCFS. Admission is strictly in that order: if the head does not fit, nothing
behind it is admitted, so a big request cannot be starved by a stream of small ones.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from ..errors import OverloadedError
from .effects import Admit, Admitted
from .forks import fork_share
from .memory import Headroom, need
from .requests import Request, RequestState

PriorityKey = Callable[[Request], tuple]
Matcher = Callable[[Request, Sequence[Request]], Any]  # prefix lookup: a prefix.Share or None


def fcfs_priority(request: Request) -> tuple:
    """Default order: resumed first, then higher priority, then earlier arrival."""
    return (0 if request.preemptions else 1, -request.priority, request.arrival)


class SeqIdPool:
    """The lanes: sequence ids 0..ceiling-1, lowest first so ids stay dense."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self._free = list(range(ceiling - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._free)

    def take(self) -> int:
        return self._free.pop()

    def give(self, seq_id: int) -> None:
        assert seq_id not in self._free, f"seq id {seq_id} returned twice"
        self._free.append(seq_id)
        self._free.sort(reverse=True)


class Admission:
    def __init__(
        self,
        ceiling: int,
        max_waiting: int,
        decode_reserve: int = 16,
        key: PriorityKey = fcfs_priority,
        exact: bool = False,
    ) -> None:
        self.exact = exact  # prefixes are shared only whole (recurrent state, sliding window): forks' shares
        self.lanes = SeqIdPool(ceiling)
        self.max_waiting = max_waiting
        self.decode_reserve = decode_reserve
        self.key = key
        self.waiting: list[Request] = []  # kept sorted by key
        self.blocked: dict | None = None  # after admit(): cells the head lacked, if memory stopped it
        self.cancelled_here: list[Request] = []
        self._admissions = itertools.count()
        # totals, read by stats when asked
        self.submitted = self.rejected = self.admitted = self.cancelled = 0

    def submit(self, request: Request) -> None:
        """Queue a new request, or fail fast with OverloadedError."""
        if len(self.waiting) >= self.max_waiting:
            request.state = RequestState.REJECTED
            self.rejected += 1
            raise OverloadedError(len(self.waiting), self.max_waiting)
        self.submitted += 1
        self._insert(request)

    def requeue(self, request: Request) -> None:
        """A preempted request goes back to the head; never refused, whatever the bound."""
        if request.seq_id is not None:
            self.lanes.give(request.seq_id)
            request.seq_id = None
        request.cached = 0
        request.share = None
        self._insert(request)

    def _insert(self, request: Request) -> None:
        request.state = RequestState.WAITING
        key = self.key(request)
        i = len(self.waiting)
        while i > 0 and self.key(self.waiting[i - 1]) > key:
            i -= 1
        self.waiting.insert(i, request)

    def cancel(self, request: Request) -> bool:
        """Remove a waiting request; False if it is not waiting (the composer owns it)."""
        if request in self.waiting:
            self.waiting.remove(request)
            request.state = RequestState.CANCELLED
            request.finish_reason = "cancelled"
            self.cancelled += 1
            return True
        return False

    def answer(self, query: Admit) -> tuple[Admitted, list[Request]]:
        """The step's Admit answered, and the requests admit() dropped as cancelled on the way: each
        still needs its final event (a preempted request whose Cancel came while it was out of the queue)."""
        admitted = self.admit(query.headroom, query.match)
        gone, self.cancelled_here = self.cancelled_here, []
        return Admitted(tuple(admitted), len(self.waiting), self.blocked), gone

    def release(self, seq_id: int) -> None:
        self.lanes.give(seq_id)

    def _share(self, head: Request, admitted: Sequence[Request], match: Matcher | None) -> Any:
        """The prefix `head` is promised: none when it scores its prompt (every prompt row must be
        computed), its parent's prompt cells for a fork (n > 1), else the prefix cache's best."""
        if head.prompt_logprobs is not None:
            return None
        share = fork_share(head, self.exact) if head.fork_of is not None else None
        if share is None and match is not None:
            share = match(head, admitted)
        return share

    def admit(self, headroom: Headroom, match: Matcher | None = None) -> list[Request]:
        """Move requests from the head of the queue while a lane and every component has room.

        With `match`, a head whose prompt prefix is (or is about to be) in memory is promised
        that prefix and needs cells only for the rest."""
        admitted: list[Request] = []
        self.blocked = None
        while self.waiting and len(self.lanes):
            head = self.waiting[0]
            if head.cancel_requested:
                # cancelled while out of the queue (a preempted request on its way back): its Cancel
                # found nothing to remove, so the caller finishes it (see take_cancelled)
                self.cancel(head)
                self.cancelled_here.append(head)
                continue
            head.share = self._share(head, admitted, match)
            cells = need(head, self.decode_reserve)
            if not headroom.fits(cells):
                head.share = None
                self.blocked = headroom.missing(cells)
                break
            headroom = headroom.take(cells)
            self.waiting.pop(0)
            head.seq_id = self.lanes.take()
            head.shared_tokens = 0
            head.state = RequestState.RUNNING
            head.admitted_at = next(self._admissions)
            admitted.append(head)
        self.admitted += len(admitted)
        return admitted
