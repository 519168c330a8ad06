"""Composer actor: drives the step loop over scheduling.Composer.

Per step: sweep cancellations (their cells are freed before anything else) -> relieve
decode pressure (evict resident prefixes first, then preempt), or else admit -> copy in
shared prefixes -> compose -> one Step on the runtime -> route tokens, record prompts
just prefilled in the prefix cache, release finished sequences -> telemetry. A step
that preempted admits nothing new.

The prefix cache (scheduling.prefix) is owned here: the composer is the one actor that
sees requests from admission to release, which is the lifetime of a live source.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Mapping, Sequence

import trio
from loguru import logger

from ..errors import NoKvSlotError, StepFailedError
from ..kv import ComponentKind, Ledger
from ..scheduling.composer import Composer, StepPlan
from ..scheduling.memory import Headroom, shortfall, step_need
from ..scheduling.prefix import Entry, PrefixCache, Share
from ..scheduling.requests import Request, RequestState
from ..telemetry import Counters, StepReport
from ._mail import call, deliver
from .messages import AdmitQuery, LedgerQuery, Pressure, Release, Released, ShareCells, Step, StepResult

ATTN = ComponentKind.ATTN


class ComposerActor:
    def __init__(
        self,
        policy: Composer,
        inbox: trio.MemoryReceiveChannel,
        runtime: trio.MemorySendChannel,
        admission: trio.MemorySendChannel,
        preemption: trio.MemorySendChannel,
        ledger: Ledger,
        counters: Counters,
        decode_reserve: int,
        on_step: Callable[[StepReport], None] | None = None,
        prefix: PrefixCache | None = None,
    ) -> None:
        self.policy = policy
        self.inbox = inbox
        self.runtime = runtime
        self.admission = admission
        self.preemption = preemption
        self.ledger = ledger
        self.counters = counters
        self.decode_reserve = decode_reserve
        self.on_step = on_step
        self.prefix = prefix
        self.waiting = 0
        self.step_no = 0

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        preempted_last = False
        async with self.inbox:
            while True:
                self._drain()
                t0 = time.perf_counter()
                await self._sweep_cancelled()
                victims = await self._relieve(self._decode_shortfall())
                admitted: Sequence[Request] = ()
                queried = not victims and not preempted_last
                if queried:
                    headroom = Headroom.of(self.ledger, self.policy.running, self.decode_reserve)
                    match = self._match if self.prefix is not None else None
                    answer = await call(self.admission, lambda r: AdmitQuery(headroom, r, match))
                    admitted, self.waiting = answer.requests, answer.waiting
                    self._admitted(admitted)
                    if not admitted and answer.blocked and await self._evict_for(answer.blocked, guess=True):
                        continue  # the cache gave the queue head its room: ask again
                await self._copy_shares()
                plan = self.policy.compose(self._attn_free())
                stuck = plan.n_tokens == 0 and bool(self.policy.running)
                if plan.starved or stuck or shortfall(self.ledger, self._need(plan)):
                    more = await self._relieve(self._decode_shortfall() or {ATTN: max(1, plan.starved)}, at_least=1)
                    victims += more
                    await self._copy_shares()
                    plan = self.policy.compose(self._attn_free())
                preempted_last = bool(victims)
                n_running = len(self.policy.running)
                if plan.n_tokens == 0:
                    if victims or not queried:
                        continue  # the next round may admit
                    if self.policy.running:  # nothing fits and nobody can be preempted
                        await self._fail(self.policy.running[-1:], NoKvSlotError(1, "a sequence cannot fit the memory left"))
                        continue
                    # idle: wait for a submission or cancellation; poll while requests wait for memory
                    # held by someone else (it frees without telling us)
                    self.counters.running = 0
                    with trio.move_on_after(0.05 if self.waiting else math.inf):
                        await self.inbox.receive()
                    self.ledger = await call(self.runtime, LedgerQuery)
                    self.counters.ledger, self.counters.running = self.ledger, 0
                    continue
                t_compose = time.perf_counter() - t0
                samplers = tuple(r.sampler for r in plan.output_requests)
                result: StepResult = await call(self.runtime, lambda r: Step(plan, samplers, r))
                self.ledger = result.ledger
                t1 = time.perf_counter()
                finished, failed, outputs = await self._settle(plan, result)
                if isinstance(result.error, NoKvSlotError):
                    victims += await self._relieve({ATTN: plan.n_tokens}, at_least=1)
                    preempted_last = True
                t_step = time.perf_counter() - t0
                self._report(n_running, plan, admitted, victims, finished, failed, outputs, result,
                             t_compose, time.perf_counter() - t1 + result.t_sample, t_step)

    def _drain(self) -> None:
        while True:
            try:
                self.inbox.receive_nowait()
            except trio.WouldBlock:
                return

    # -- memory ----------------------------------------------------------------------

    def _attn_free(self) -> int | None:
        attn = self.ledger.get(ATTN)
        return attn.free if attn else None

    def _need(self, plan: StepPlan) -> dict[ComponentKind, int]:
        return step_need(plan.n_tokens, plan.new_sequences)

    def _decode_shortfall(self) -> dict[ComponentKind, int]:
        decoding = sum(1 for r in self.policy.running if r.pending == 1)
        return shortfall(self.ledger, step_need(decoding, 0))

    async def _relieve(self, missing: dict[ComponentKind, int], at_least: int = 0) -> list[Request]:
        """Free cells: evict resident prefixes first; preempt only if that is not enough."""
        if not missing and not at_least:
            return []
        if missing and await self._evict_for(missing):
            return []
        running = tuple(self.policy.running)
        answer = await call(self.preemption, lambda r: Pressure(running, missing, at_least, r))
        for v in answer.victims:
            self.policy.remove(v)
            if self.prefix is not None:
                self.prefix.remove_live(v)
        self.ledger = answer.ledger
        return list(answer.victims)

    async def _release(self, requests: Sequence[Request]) -> None:
        if self.prefix is not None:
            for r in requests:
                self.prefix.remove_live(r)
        seq_ids = tuple(r.seq_id for r in requests if r.seq_id is not None)
        if not seq_ids:
            return
        self.ledger = await call(self.runtime, lambda r: Release(seq_ids, r))
        for r in requests:
            r.seq_id = None
        # stats() reads these between steps too: cells freed by a cancel show before the next step
        self.counters.ledger = self.ledger
        self.counters.running = len(self.policy.running)
        await call(self.admission, lambda r: Released(seq_ids, r))

    # -- prefix cache ----------------------------------------------------------------

    def _match(self, request: Request, admitted: Sequence[Request]) -> Share | None:
        """Admission's lookup (called while this actor awaits the admission reply)."""
        return self.prefix.match(request, admitted)

    def _admitted(self, admitted: Sequence[Request]) -> None:
        self.policy.add(admitted)
        if self.prefix is None:
            return
        for r in admitted:
            self.counters.prefix_queries += int(r.prompt.size)
            if self.prefix.exact:
                self._plan_snapshots(r)
            self.prefix.add_live(r)
            if r.share is not None and r.share.resident:
                self.prefix.touch(r.share.source)

    def _plan_snapshots(self, r: Request) -> None:
        """Recurrent state: a live source pauses where it is shared; else r pauses where prompts part."""
        if r.share is not None and not r.share.resident:
            r.share.source.pauses.add(r.share.length)
        elif r.share is None:
            common = self.prefix.common(r)
            if self.prefix.block <= common < r.prompt.size:
                r.pauses.add(common)

    def _protected(self) -> set[int]:
        """Entries a request is about to copy from: never evicted before it has."""
        return {r.share.source.seq_id for r in self.policy.running if r.share is not None and r.share.resident}

    def _source_seq(self, share: Share) -> int | None:
        """The sequence to copy from now; None while a live source is still computing the prefix,
        -1 when the source is gone."""
        src = share.source
        if share.resident:
            return src.seq_id if self.prefix.entries.get(src.seq_id) is src else -1
        if src.state is not RequestState.RUNNING or src.seq_id is None or src.cancel_requested \
                or src not in self.policy.running:
            return -1
        if src.cached < share.length:
            return None
        if self.prefix.exact and src.cached > share.length:
            return -1  # its state moved on (its snapshot, if recorded, is an entry now)
        return src.seq_id

    async def _copy_shares(self) -> None:
        """Copy promised prefixes into their requests, once their sources hold them."""
        if self.prefix is None:
            return
        for r in [r for r in self.policy.running if r.share is not None]:
            seq = self._source_seq(r.share)
            if seq == -1:  # its source left (finished, cancelled, preempted, evicted): look again
                r.share = self.prefix.match(r, ())
                seq = self._source_seq(r.share) if r.share is not None else None
                if seq == -1:
                    r.share = None
                elif r.share is not None and seq is None and self.prefix.exact:
                    r.share.source.pauses.add(r.share.length)  # a live source must stop where it is shared
            if seq is None or seq == -1:
                continue
            length = r.share.length
            answer = await call(self.runtime, lambda rep: ShareCells(seq, r.seq_id, length, rep))
            self.ledger = answer.ledger
            r.share = None
            r.cached = r.cached_tokens = answer.granted
            self.counters.prefix_hits += answer.granted
            logger.debug("request {} shares {} of {} prompt tokens from seq {}", r.id, answer.granted, length, seq)
        if self.policy.running and all(r.share is not None for r in self.policy.running):
            for r in self.policy.running:  # nobody computes what the others wait for (never expected: match()
                r.share = None             # takes no source that is itself waiting): each computes its own
            logger.warning("{} requests waited for shared prefixes nobody computes; they compute their own",
                           len(self.policy.running))

    async def _record(self, plan: StepPlan) -> None:
        """Keep prompts that this step finished prefilling as resident prefixes."""
        for c in plan.chunks:
            r, end = c.request, c.start + c.n
            if r.seq_id is None or r.cancel_requested:
                continue
            if self.prefix.exact:  # a recurrent state is a snapshot of exactly where the chunk ended
                if end != r.prompt.size and end not in r.pauses:
                    continue
                p = end
            else:
                p = int(r.prompt.size)
                if not c.start < p <= end:
                    continue
            evicted = self.prefix.plan_record(r.prompt[:p], self._protected())
            if evicted is None:
                continue
            await self._free_entries(evicted)
            entry = self.prefix.add(r.prompt[:p])
            answer = await call(self.runtime, lambda rep: ShareCells(r.seq_id, entry.seq_id, p, rep))
            self.ledger = answer.ledger
            if answer.granted == 0:  # the family could not keep it (e.g. sliding window moved on)
                self.prefix.drop(entry)  # its sequence holds nothing
        self._publish_prefix()

    async def _free_entries(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        for e in entries:
            self.prefix.drop(e)
        self.ledger = await call(self.runtime, lambda r: Release(tuple(e.seq_id for e in entries), r))
        self.counters.prefix_evictions += len(entries)
        self.counters.ledger = self.ledger
        self._publish_prefix()

    async def _evict_for(self, missing: Mapping[ComponentKind, int], guess: bool = False) -> bool:
        """Evict least recently used entries until `missing` cells are free; True if that did it.

        Entries share cells with running sequences; seq_rm frees only what no sequence
        still holds, so a running sequence never loses a cell. With `guess` (admission
        pressure) nothing is evicted unless the cache provably holds enough cells alone:
        used cells minus every running sequence's cells."""
        if self.prefix is None or not self.prefix.entries:
            return False
        start = {c.kind: c.free for c in self.ledger.components}
        if guess:
            attn = self.ledger.get(ATTN)
            alone = attn.used - sum(r.cached for r in self.policy.running) if attn else 0
            if alone < missing.get(ATTN, 0):
                return False
        protected = self._protected()
        while True:
            entry = self.prefix.lru(protected)
            if entry is None:
                return False
            await self._free_entries([entry])
            now = {c.kind: c.free for c in self.ledger.components}
            if all(now.get(k, 0) - start.get(k, 0) >= n for k, n in missing.items()):
                logger.debug("prefix cache evicted down to {} entries to free {}", len(self.prefix.entries), dict(missing))
                return True

    def _publish_prefix(self) -> None:
        self.counters.prefix_entries = len(self.prefix.entries)
        self.counters.prefix_resident_tokens = self.prefix.resident_tokens

    # -- finishing -------------------------------------------------------------------

    async def _sweep_cancelled(self) -> list[Request]:
        gone = self.policy.cancelled()
        if gone:
            for r in gone:
                deliver(r.sink, self.policy.end(r, "cancelled").event)
                self.counters.finished["cancelled"] += 1
                logger.debug("request {} cancelled while running", r.id)
            await self._release(gone)
        return gone

    async def _fail(self, requests: list[Request], cause: Exception) -> None:
        for r in requests:
            err = StepFailedError(f"request {r.id} failed in step {self.step_no}: {cause!r}")
            err.__cause__ = cause
            deliver(r.sink, self.policy.end(r, "error", err).event)
            self.counters.finished["error"] += 1
        logger.warning("step {} failed for {} request(s): {!r}", self.step_no, len(requests), cause)
        await self._release(requests)

    async def _settle(self, plan: StepPlan, result: StepResult) -> tuple[list[Request], list[Request], int]:
        """Apply a step's outcome: (finished, failed, output tokens)."""
        if result.error is None:
            try:
                events, finished = self.policy.apply(plan, result.tokens, result.pieces, result.eog)
            except Exception as exc:  # a bug in routing must not take the engine down with it
                in_step = list(dict.fromkeys(c.request for c in plan.chunks if c.request in self.policy.running))
                await self._fail(in_step, exc)
                return [], in_step, 0
            for e in events:
                deliver(e.request.sink, e.event)
                if e.event.final:
                    self.counters.finished[e.event.finish_reason] += 1
            if self.prefix is not None:
                await self._record(plan)  # before release: a request that just finished still holds its prompt
            await self._release(finished)
            return finished, [], len(events)
        in_step = list(dict.fromkeys(c.request for c in plan.chunks if c.request in self.policy.running))
        if isinstance(result.error, NoKvSlotError):
            # nothing of the batch stayed in memory; sequences that could not be rolled back restart
            for r in in_step:
                if r.seq_id in result.lost:
                    r.cached = 0
            return [], [], 0
        await self._fail(in_step, result.error)
        return [], in_step, 0

    # -- telemetry -------------------------------------------------------------------

    def _report(
        self, n_running: int, plan: StepPlan, admitted: Sequence[Request], victims: Sequence[Request],
        finished: Sequence[Request], failed: Sequence[Request], outputs: int, result: StepResult,
        t_compose: float, t_sample: float, t_step: float,
    ) -> None:
        self.step_no += 1
        ledger = self.ledger
        report = StepReport(
            step=self.step_no,
            running=n_running,
            waiting=self.waiting,
            admitted=len(admitted),
            preempted=len(victims),
            finished=len(finished),
            prefill_tokens=plan.n_prefill,
            decode_tokens=plan.n_decode,
            kv_used={c.kind: c.used for c in ledger.components},
            kv_free={c.kind: c.free for c in ledger.components},
            t_compose=t_compose,
            t_decode=result.t_decode,
            t_sample=t_sample,
            t_step=t_step,
            decode_ids=tuple(c.request.id for c in plan.chunks if c.decode),
            prefill_ids=tuple(c.request.id for c in plan.chunks if not c.decode),
            failed=len(failed),
        )
        self.counters.ledger = ledger
        self.counters.record(report, outputs)
        self.counters.running = len(self.policy.running)  # now, not at compose time: finished ones are gone
        logger.debug("step {}: run={} wait={} +{} -{} fin={} prefill={} decode={} kv={} "
                     "compose={:.2f}ms decode={:.2f}ms sample={:.2f}ms",
                     report.step, report.running, report.waiting, report.admitted, report.preempted,
                     report.finished, report.prefill_tokens, report.decode_tokens, dict(report.kv_used),
                     1e3 * t_compose, 1e3 * result.t_decode, 1e3 * t_sample)
        if self.on_step is not None:
            self.on_step(report)
