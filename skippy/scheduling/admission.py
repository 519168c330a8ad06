"""The waiting queue and the admission decision: pure, no trio, no llama.

Order: preempted requests first (they already waited once), then by priority (lower
first, as vLLM's), then FCFS. Admission is strictly in that order: if the head does not
fit, nothing behind it is admitted, so a big request cannot be starved by a stream of
small ones.

With latency targets (the step's SloGate, scheduling.slo) the order is by effective
priority (aged: one level better per AGING_TTFTS targets waited), on-time before late,
then least slack to the first-token deadline, and admission also stops while one more
sequence would push a decode-only step past the TPOT target. A head that could not make
its first token in time if admitted now becomes late: it goes behind the on-time ones and
starts while the lanes left still hold the on-time streams the target allows (it decodes in
the time on-time work leaves: scheduling.slo.SloGate.late_room, scheduling.budget); with
`shed_late` it is refused there and then.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

from ..errors import LateRequestError, OverloadedError
from .effects import Admit, Admitted
from .forks import fork_share
from .memory import Headroom, need
from .requests import Request, RequestState, TokenEvent
from .slo import AGING_TTFTS, SloGate

PriorityKey = Callable[[Request], tuple]
Matcher = Callable[[Request, Sequence[Request]], Any]  # prefix lookup: a prefix.Share or None


def fcfs_priority(request: Request) -> tuple:
    """Default order: resumed first, then priority (lower first), then earlier arrival."""
    return (0 if request.preemptions else 1, request.priority, request.arrival)


def slo_order(request: Request, now: float) -> tuple:
    """The order under latency targets: resumed first, then aged priority, on-time before late, then the
    first-token deadline (least slack), then arrival."""
    deadline = request.deadline if request.deadline is not None else now
    ttft = max(deadline - request.t_arrival, 1e-3)
    aged = request.priority - int(max(0.0, now - request.t_arrival) / (AGING_TTFTS * ttft))
    return (0 if request.preemptions else 1, aged, request.late, deadline, request.arrival)


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
        self.slo_held = False  # after admit(): the TPOT target, not memory, stopped it
        self.cancelled_here: list[Request] = []
        self.ended_here: list[tuple[Request, TokenEvent]] = []  # shed by admit(): each needs its final event
        self._admissions = itertools.count()
        # totals, read by stats when asked
        self.submitted = self.rejected = self.admitted = self.cancelled = self.shed = 0

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

    def answer(self, query: Admit) -> tuple[Admitted, list[tuple[Request, TokenEvent]]]:
        """The step's Admit answered, and the requests admit() ended on the way, each with the final event
        it still needs: a preempted request whose Cancel came while it was out of the queue, or one shed."""
        admitted = self.admit(query.headroom, query.match, query.slo)
        gone, self.cancelled_here = self.cancelled_here, []
        ended, self.ended_here = self.ended_here, []
        ended = [(r, TokenEvent(None, "", len(r.generated), "cancelled", r.usage)) for r in gone] + ended
        return Admitted(tuple(admitted), len(self.waiting), self.blocked), ended

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

    def admit(self, headroom: Headroom, match: Matcher | None = None, slo: SloGate | None = None) -> list[Request]:
        """Move requests from the head of the queue while a lane and every component has room (and, with
        `slo`, while the targets allow: see the module's docstring).

        With `match`, a head whose prompt prefix is (or is about to be) in memory is promised
        that prefix and needs cells only for the rest."""
        admitted: list[Request] = []
        self.blocked = None
        self.slo_held = False
        if slo is not None:
            self._reorder(slo)
        i = 0  # the head: late requests the late lane has no room for are stepped over, nobody else
        while i < len(self.waiting) and len(self.lanes):
            head = self.waiting[i]
            if head.cancel_requested:
                # cancelled while out of the queue (a preempted request on its way back): its Cancel
                # found nothing to remove, so the caller finishes it (see take_cancelled)
                self.cancel(head)
                self.cancelled_here.append(head)
                continue
            if slo is not None and head.fork_of is None:  # a fork goes with its first choice (scheduling.forks)
                if not slo.decode_room(head):
                    self.slo_held = True  # the running set is as large as the TPOT target allows
                    break
                if not head.late and not head.preemptions:
                    eta = slo.first_token_eta(head)
                    if eta == math.inf:  # the decode rows leave no prefill time now: wait for a stream to end
                        self.slo_held = True
                        break
                    if eta > slo.policy.first_deadline(head):
                        self._late(head, slo)
                        continue
                if head.late and not slo.late_room(len(self.lanes), self.lanes.ceiling):
                    i += 1  # on-time requests behind it still go: late ones take only room nobody on time needs
                    continue
            head.share = self._share(head, admitted, match)
            cells = need(head, self.decode_reserve)
            if not headroom.fits(cells):
                head.share = None
                self.blocked = headroom.missing(cells)
                break
            headroom = headroom.take(cells)
            self.waiting.pop(i)
            if slo is not None:
                slo.take(head)
            head.seq_id = self.lanes.take()
            head.shared_tokens = 0
            head.state = RequestState.RUNNING
            head.admitted_at = next(self._admissions)
            admitted.append(head)
        self.admitted += len(admitted)
        return admitted

    def _reorder(self, slo: SloGate) -> None:
        """Deadlines set, requests that could not make their first token even alone marked late (shed with
        `shed_late`), the queue in the targets' order."""
        policy = slo.policy
        for r in list(self.waiting):
            policy.first_deadline(r)
            if (not r.late and not r.preemptions and r.fork_of is None and r.cached == 0
                    and policy.prefill_hopeless(r, slo.now)):
                self._late(r, slo, requeue=False)
        if len(self.waiting) > 1:
            self.waiting.sort(key=lambda r: slo_order(r, slo.now))

    def _late(self, r: Request, slo: SloGate, requeue: bool = True) -> None:
        """`r` can no longer meet its first-token deadline: shed it, or move it behind the on-time ones."""
        r.late = True
        self.waiting.remove(r)
        if slo.policy.shed_late:
            waited = slo.now - r.t_arrival
            err = LateRequestError(r.id, waited, max(1.0, r.deadline - r.t_arrival if r.deadline else 1.0))
            r.state = RequestState.REJECTED
            r.finish_reason = "error"
            self.shed += 1
            self.ended_here.append((r, TokenEvent(None, "", 0, "error", r.usage, err)))
            return
        if requeue:
            key = slo_order(r, slo.now)
            i = len(self.waiting)
            while i > 0 and slo_order(self.waiting[i - 1], slo.now) > key:
                i -= 1
            self.waiting.insert(i, r)
        else:
            self.waiting.append(r)  # the sort that follows puts it in its place
