"""The step: one scheduler iteration, in one place. Pure: no trio, no llama.

`StepScheduler.step()` is a generator (sans-IO, the way h11 keeps protocol logic apart
from sockets): it yields the effects it needs (scheduling.effects) and is sent each one's
answer, then returns the step's StepReport (None when no batch ran). The composer actor
drives it over the actors; skippy.testing.SyncScheduler drives it synchronously over a
FakeRuntime for the hypothesis machines. Either way every transition is this code's.

Per step: sweep cancellations (their cells are freed before anything else) -> relieve
decode pressure (evict resident prefixes first, then preempt), or else admit -> copy in
shared prefixes -> compose -> one Decode -> route tokens, keep prompts just prefilled in
the prefix cache, release finished sequences -> the report. A step that preempted admits
nothing new. In steady decoding the decode is overlapped with the next one (see _chain).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Generator, Mapping, Sequence

from loguru import logger

from ..errors import NoKvSlotError, StepFailedError
from ..kv import ComponentKind, Ledger
from ..telemetry import Totals, StepReport
from .budget import TokenBudget
from .composer import Composer, StepPlan
from .effects import (
    Admit, Admitted, Collect, Decode, Deliver, FreeCells, Idle, Launch, Preempt, Preempted, ReturnLanes, ShareCells,
    Shared,
    StepResult,
)
from .forks import fork_source, is_fork_share
from .memory import Headroom, shortfall, step_need
from .prefix import Entry, PrefixCache
from .requests import Request
from .run_ahead import RUN_STEPS, RunAhead, RunResult, may_run, route

ATTN = ComponentKind.ATTN
IDLE_POLL_S = 0.05  # while requests wait for memory someone else holds (it frees without telling us)

Effects = Generator[Any, Any, Any]


class StepScheduler:
    """The running set, the prefix cache and the ledger as the last answer left it."""

    def __init__(self, n_batch: int, decode_reserve: int, ledger: Ledger, prefix: PrefixCache | None = None,
                 totals: Totals | None = None, budget: TokenBudget | None = None, overlap: bool = True,
                 exact: bool = False, run_ahead: bool = True, clock: Any = time.perf_counter,
                 equal_split: bool = False) -> None:
        self.composer = Composer(n_batch, budget, equal_split)
        self.clock = clock  # the latency targets' clock: requests' t_arrival is on it (scheduling.slo)
        self.slo = budget.slo if budget is not None else None
        self._targets_told = False
        self.decode_reserve = decode_reserve
        self.ledger = ledger
        self.prefix = prefix
        self.totals = totals if totals is not None else Totals()
        self.waiting = 0  # as admission last said
        self.preempted_last = False
        self.step_no = 0
        self._busy_since: tuple[float, float] | None = None  # (start, decode seconds) of the last step that ran
        self.overlap = overlap  # chain steady decode steps (see _chain)
        self.exact = exact  # a prefix is shared only whole (recurrent state, sliding window): forks' parents pause
        self._sharing = False  # a running request may wait for a promised prefix (forks, without a prefix cache)
        self._woken = True
        self._inflight: tuple[StepPlan, Any] | None = None  # a launched step not yet collected
        self._deferred: list[Request] = []  # finished while a step that holds them was in flight
        self.run_ahead = run_ahead  # steady steps of inline-read streams go on off the event loop (see _run_for)
        self._run: RunAhead | None = None  # the in-flight ticket is a run's
        self.run_reports: list[StepReport] = []  # steps a run routed, not yet taken (take_reports)
        self._flushes: list[Callable[[int | None], None]] = []  # waiting for the prefix cache's flush (request_flush)

    @property
    def running(self) -> list[Request]:
        return self.composer.running

    @property
    def idle(self) -> bool:
        """No step in flight and no release pending."""
        return self._inflight is None and not self._deferred

    @property
    def in_flight(self) -> StepPlan | None:
        """The overlapped step launched and not yet collected (it may be computing now)."""
        return self._inflight[0] if self._inflight is not None else None

    @property
    def holding(self) -> list[Request]:
        """Finished requests whose lanes wait for the step in flight that still decodes them."""
        return list(self._deferred)

    # -- the step --------------------------------------------------------------------

    def step(self, woken: bool = True) -> Generator[Any, Any, StepReport | None]:
        """One iteration. `woken`: something may have changed outside (a submission, a cancel); the
        driver passes False only when it knows nothing did, so admission need not be asked."""
        t0 = time.perf_counter()
        self._close_busy(t0)
        self._woken = self._woken or woken
        if self._inflight is not None:
            return (yield from self._chain(t0))
        yield from self._release_deferred()
        yield from self._sweep_cancelled()
        if self._flushes:
            yield from self._flush_prefixes()
        victims = yield from self._relieve(self._decode_shortfall())
        admitted: Sequence[Request] = ()
        queried = not victims and not self.preempted_last
        now = self.clock()
        planned = self._mark_late_prompts(now)
        if queried and (self._woken or self.waiting):
            self._woken = False
            headroom = Headroom.of(self.ledger, self.running, self.decode_reserve)
            gate = self.slo.gate(self.running, now) if planned else None  # built only when admission is asked
            answer: Admitted = yield Admit(headroom, self.prefix.match if self.prefix is not None else None, gate)
            admitted, self.waiting = answer.requests, answer.waiting
            self._admitted(admitted)
            if not admitted and answer.blocked and (yield from self._evict_for(answer.blocked, guess=True)):
                return None  # the cache gave the queue head its room: ask again
        yield from self._copy_shares()
        plan = self.composer.compose(self._attn_free(), now)
        stuck = plan.n_tokens == 0 and bool(self.running)
        if plan.starved or stuck or shortfall(self.ledger, self._need(plan)):
            more = yield from self._relieve(self._decode_shortfall() or {ATTN: max(1, plan.starved)}, at_least=1)
            victims += more
            yield from self._copy_shares()
            plan = self.composer.compose(self._attn_free(), now)
        self.preempted_last = bool(victims)
        n_running = len(self.running)
        if plan.n_tokens == 0:
            if victims or not queried:
                return None  # the next round may admit
            if self.running:  # nothing fits and nobody can be preempted
                yield from self._fail(self.running[-1:], NoKvSlotError(1, "a sequence cannot fit the memory left"))
                return None
            self._close_busy(time.perf_counter())
            self._busy_since = None  # waiting for work is not overhead
            self.ledger = yield Idle(IDLE_POLL_S if self.waiting else None)
            self._woken = True  # the wait ended on a wake-up (or a poll): look at the queue
            return None
        t_compose = time.perf_counter() - t0
        samplers = tuple(r.sampler for r in plan.output_requests)
        if self.overlap and not victims and len(plan.chunks) == len(self.running) and self._steady(plan):
            self._inflight = (plan, (yield Launch(plan, samplers)))
            return (yield from self._chain(t0, admitted, t_compose))
        result: StepResult = yield Decode(plan, samplers)
        return (yield from self._finish(plan, result, t0, t_compose=t_compose, n_running=n_running,
                                        admitted=admitted, victims=victims))

    def _finish(self, plan: StepPlan, result: StepResult, t0: float, *, t_compose: float, n_running: int,
                admitted: Sequence[Request], victims: list[Request]) -> Effects:
        """Account a step's result: route its tokens, keep prompts, release what finished, report."""
        self.ledger = result.ledger
        self._busy_since = (t0, result.t_decode)
        if result.error is None and self.composer.budget is not None and plan.shape is not None:
            self.composer.budget.observe(plan.shape, result.t_decode)
        t1 = time.perf_counter()
        finished, failed, outputs = yield from self._settle(plan, result)
        if isinstance(result.error, NoKvSlotError):
            free = sum(c.free for c in self.ledger.components)
            more = yield from self._relieve({ATTN: plan.n_tokens}, at_least=1)
            if not more and sum(c.free for c in self.ledger.components) <= free:
                # nobody could be preempted and nothing was freed: the same batch would fail again
                # forever. Like a step that nothing fits, its newest request fails instead.
                in_step = {id(c.request) for c in plan.chunks}
                stuck = [r for r in self.running if id(r) in in_step][-1:]
                yield from self._fail(stuck, result.error)
                failed = [*failed, *stuck]
            victims += more
            self.preempted_last = True
        t_step = time.perf_counter() - t0
        return self._report(n_running, plan, admitted, victims, finished, failed, outputs, result,
                            t_compose, time.perf_counter() - t1 + result.t_sample, t_step)

    # -- overlapped decode steps ---------------------------------------------------------
    # In steady decoding (every running sequence decodes, nothing waits, nothing changed) the
    # next step is launched chained before this one's result is read: the worker thread starts
    # it the moment this one's tokens are sampled, while this thread routes and streams them.
    # Its batch is exactly what the synchronous path would compose (the same sequences, one
    # position on, the sampled tokens), so outputs are the same; a sequence that finishes by
    # end-of-generation or a stop string has decoded one token more, which is dropped, and its
    # release waits until that step is collected. Anything else ends the chain: the launched
    # step is collected and the next iteration is synchronous again.

    def _steady(self, plan: StepPlan) -> bool:
        """Whether the decode step after `plan` (still running) can be launched now."""
        if self._woken or self.waiting or self._deferred or self.preempted_last or not plan.all_decode or plan.yielded:
            return False
        running = set(map(id, self.running))
        for c in plan.chunks:
            r = c.request
            if r.cancel_requested or r.share is not None or r.remaining < 2 or id(r) not in running:
                return False
            if c.start < r.prompt.size:  # its prompt's last token: the prefix cache records it (a runtime call)
                return False
        attn = self.ledger.get(ATTN)
        return attn is None or attn.free >= 2 * plan.n_tokens + self.decode_reserve

    def _chain(self, t0: float, admitted: Sequence[Request] = (), t_compose: float = 0.0) -> Effects:
        if self._run is not None:
            return (yield from self._collect_run(t0))
        plan, ticket = self._inflight
        nxt = run = None
        if self._steady(plan):
            nxt, nticket, run = yield from self._launch_after(plan)
        routed = False
        try:
            result: StepResult = yield Collect(ticket)
            if nxt is not None and result.error is not None:
                if run is not None:  # it routes nothing: a chained step does not run after a failed one
                    run.stop.set()
                    run.ready.set()
                yield Collect(nticket, run)  # skipped
                nxt = run = None
            self._inflight = (nxt, nticket) if nxt is not None else None
            self._run = run
            if result.skipped:  # nothing ran, nothing changed
                return None
            report = yield from self._finish(plan, result, t0, t_compose=t_compose, n_running=len(self.running),
                                             admitted=admitted, victims=[])
            routed = True
        finally:
            if run is not None:  # the run routes its steps once this one's are routed (or none, if it failed)
                if not routed:
                    run.stop.set()
                run.ready.set()
        if self._inflight is None:
            yield from self._release_deferred()
        return report

    # -- run-ahead (scheduling.run_ahead) --------------------------------------------------

    def _launch_after(self, plan: StepPlan) -> Effects:
        """Launch the decode step after `plan`, chained on it, as a run where its streams allow one:
        (its plan, its ticket, its run or None)."""
        nxt = plan.advanced()
        run = self._run_for(nxt)
        ticket = yield Launch(nxt, tuple(r.sampler for r in nxt.output_requests), chained=True, run=run)
        return nxt, ticket, run

    def _run_for(self, plan: StepPlan) -> RunAhead | None:
        """A run from `plan` on, where every stream of it is read inline."""
        if not self.run_ahead or not may_run(plan):
            return None
        return RunAhead(RUN_STEPS, partial(route, reserve=self.decode_reserve))

    def _collect_run(self, t0: float) -> Effects:
        """Account a run's steps: those routed on the worker thread are only counted (their events are
        out), the refused events are delivered, and a last step it declined is finished as any other.
        A run that reached its length with its streams still steady is followed at once, before the
        accounting, by the next step (chained on its last one): no step composed without overlap."""
        ticket, run = self._inflight[1], self._run
        if self._woken:  # a wake-up came before the collect (the composer took it): let the step see it
            run.stop.set()
        answer: RunResult = yield Collect(ticket, run)
        self._inflight = self._run = None
        plan, result, routed = answer.steps[-1]
        if routed and not answer.undelivered and not run.stop.is_set():
            self.ledger = result.ledger
            if self._steady(plan):
                nxt, nticket, follow = yield from self._launch_after(plan)
                if follow is not None:
                    follow.ready.set()  # every step before it is routed
                self._inflight, self._run = (nxt, nticket), follow
        last = None
        for plan, result, routed in answer.steps:
            if routed:
                self.totals.run_ahead_steps += 1
                self.run_reports.append(self._account(plan, result))
            else:
                last = (plan, result)
        if answer.undelivered:
            yield Deliver(answer.undelivered)
        report = None
        if last is not None and not last[1].skipped:
            report = yield from self._finish(last[0], last[1], t0, t_compose=0.0, n_running=len(self.running),
                                             admitted=(), victims=[])
        elif self.run_reports:
            report = self.run_reports.pop()
        self._busy_since = (t0, sum(result.t_decode for _, result, _ in answer.steps))
        yield from self._release_deferred()
        return report

    def _account(self, plan: StepPlan, result: StepResult) -> StepReport:
        """A step routed in a run: what _finish records, less the routing."""
        self.ledger = result.ledger
        if self.composer.budget is not None and plan.shape is not None:
            self.composer.budget.observe(plan.shape, result.t_decode)
        return self._report(len(self.running), plan, (), (), (), (), len(plan.chunks), result, 0.0, result.t_sample,
                            result.t_decode + result.t_sample)

    def take_reports(self) -> list[StepReport]:
        """The reports of steps a run routed, before the one step() returned (oldest first)."""
        reports, self.run_reports = self.run_reports, []
        return reports

    def _release_deferred(self) -> Effects:
        if self._deferred:
            gone, self._deferred = self._deferred, []
            yield from self._release(gone)

    def _close_busy(self, now: float) -> None:
        """Account the wall time from the last step's start to `now`: all of it is the engine's
        (actor hops, the worker hand-off, composing, sampling, routing, delivery) except the
        decode itself. That is the overhead figure: per-token Python work, honestly counted."""
        if self._busy_since is not None:
            start, decode = self._busy_since
            self.totals.t_busy += now - start
            self.totals.t_busy_decode += decode
            self._busy_since = (now, 0.0)

    # -- memory ------------------------------------------------------------------------

    def _attn_free(self) -> int | None:
        attn = self.ledger.get(ATTN)
        return attn.free if attn else None

    def _need(self, plan: StepPlan) -> dict[ComponentKind, int]:
        return step_need(plan.n_tokens, plan.new_sequences)

    def _decode_shortfall(self) -> dict[ComponentKind, int]:
        decoding = sum(1 for r in self.running if r.pending == 1)
        return shortfall(self.ledger, step_need(decoding, 0))

    def _relieve(self, missing: dict[ComponentKind, int], at_least: int = 0) -> Effects:
        """Free cells: evict resident prefixes first; preempt only if that is not enough."""
        if not missing and not at_least:
            return []
        if missing and (yield from self._evict_for(missing)):
            return []
        answer: Preempted = yield Preempt(tuple(self.running), missing, at_least)
        self.waiting += len(answer.victims)  # requeued: admission must be asked again
        for v in answer.victims:
            self.composer.remove(v)
            if self.prefix is not None:
                self.prefix.released(v)
        self.ledger = answer.ledger
        return list(answer.victims)

    def _release(self, requests: Sequence[Request]) -> Effects:
        """Finished, cancelled or failed requests give back their cells, then their lanes (after the
        launched step that still holds them, if one is in flight)."""
        if self.prefix is not None:
            for r in requests:
                self.prefix.released(r)
        if self._inflight is not None:
            self._deferred.extend(requests)
            return
        seq_ids = tuple(r.seq_id for r in requests if r.seq_id is not None)
        if not seq_ids:
            return
        self.ledger = yield FreeCells(seq_ids)
        for r in requests:
            r.seq_id = None
        yield ReturnLanes(seq_ids)

    # -- prefix cache ------------------------------------------------------------------

    def _admitted(self, admitted: Sequence[Request]) -> None:
        self.composer.add(admitted)
        for r in admitted:
            if r.share is not None:
                self._sharing = True
                if self.exact and is_fork_share(r):
                    r.fork_of.pauses.add(r.share.length)  # its state at the shared length is what the fork copies
        if self.prefix is None:
            return
        for r in admitted:
            self.totals.prefix_queries += int(r.prompt.size)
            self.prefix.admitted(r)

    def _copy_shares(self) -> Effects:
        """Copy promised prefixes into their requests, once their sources hold them (prefix-cache hits, and
        forks sharing their parent's prompt: scheduling.forks)."""
        if self.prefix is None and not self._sharing:
            return
        promised = [r for r in self.running if r.share is not None]
        self._sharing = bool(promised)
        for r in promised:
            fork = is_fork_share(r)
            if self.prefix is not None:
                seq = self.prefix.copy_source(r, self.running)
            else:
                seq = fork_source(r, self.running, self.exact)
            if seq is None:
                continue
            fork = fork and r.share.source is r.fork_of  # copy_source may have found another holder
            length = r.share.length
            answer: Shared = yield ShareCells(seq, r.seq_id, length)
            self.ledger = answer.ledger
            r.share = None
            r.cached = r.shared_tokens = answer.granted
            if fork:
                self.totals.fork_shared_tokens += answer.granted
            else:
                self.totals.prefix_hits += answer.granted
            logger.debug("request {} shares {} of {} prompt tokens from seq {}", r.id, answer.granted, length, seq)
        if self.prefix is not None:
            self.prefix.unwedge(self.running)

    def _record(self, plan: StepPlan) -> Effects:
        """Keep prompts that this step finished prefilling as resident prefixes."""
        for r, p in self.prefix.prefilled(plan.chunks):
            evicted = self.prefix.plan_record(r.prompt[:p], self.prefix.protected(self.running))
            if evicted is None:
                continue
            yield from self._free_entries(evicted)
            entry = self.prefix.add(r.prompt[:p])
            answer: Shared = yield ShareCells(r.seq_id, entry.seq_id, p)
            self.ledger = answer.ledger
            if answer.granted == 0:  # the family could not keep it (e.g. sliding window moved on)
                self.prefix.drop(entry)  # its sequence holds nothing

    def _free_entries(self, entries: Sequence[Entry]) -> Effects:
        if not entries:
            return
        for e in entries:
            self.prefix.drop(e)
        self.ledger = yield FreeCells(tuple(e.seq_id for e in entries))
        self.totals.prefix_evictions += len(entries)

    def request_flush(self, done: Callable[[int | None], None]) -> None:
        """Drop every resident prefix at the next step (SGLang's /flush_cache, e.g. before measuring cold
        prefills): `done(n)` with the entries dropped, or `done(None)` if a sequence still runs then (refused,
        as SGLang refuses while requests run: a running request may be about to copy from an entry)."""
        self._flushes.append(done)

    def abandon_flushes(self) -> list[Callable[[int | None], None]]:
        """The flushes nobody will carry out (the engine is closing): the caller answers them."""
        waiting, self._flushes = self._flushes, []
        return waiting

    def _flush_prefixes(self) -> Effects:
        waiting, self._flushes = self._flushes, []
        dropped: int | None = None
        if not self.running and not self._deferred:
            entries = list(self.prefix.entries.values()) if self.prefix is not None else []
            for e in entries:
                self.prefix.drop(e)
            if entries:
                self.ledger = yield FreeCells(tuple(e.seq_id for e in entries))
            dropped = len(entries)
            logger.debug("prefix cache flushed: {} entries dropped", dropped)
        for done in waiting:
            done(dropped)

    def _evict_for(self, missing: Mapping[ComponentKind, int], guess: bool = False) -> Effects:
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
            alone = attn.used - sum(r.cached for r in self.running) if attn else 0
            if alone < missing.get(ATTN, 0):
                return False
        protected = self.prefix.protected(self.running)
        while True:
            entry = self.prefix.lru(protected)
            if entry is None:
                return False
            yield from self._free_entries([entry])
            now = {c.kind: c.free for c in self.ledger.components}
            if all(now.get(k, 0) - start.get(k, 0) >= n for k, n in missing.items()):
                logger.debug("prefix cache evicted down to {} entries to free {}", len(self.prefix.entries),
                             dict(missing))
                return True

    # -- finishing -----------------------------------------------------------------------

    def _sweep_cancelled(self) -> Effects:
        gone = self.composer.cancelled()
        if gone:
            events = [self.composer.end(r, "cancelled") for r in gone]
            self.totals.finished["cancelled"] += len(gone)
            logger.debug("requests {} cancelled while running", [r.id for r in gone])
            yield Deliver(tuple(events))
            yield from self._release(gone)

    def _fail(self, requests: Sequence[Request], cause: Exception) -> Effects:
        events = []
        for r in requests:
            err = StepFailedError(f"request {r.id} failed in step {self.step_no}: {cause!r}")
            err.__cause__ = cause
            events.append(self.composer.end(r, "error", err))
        self.totals.finished["error"] += len(requests)
        logger.warning("step {} failed for {} request(s): {!r}", self.step_no, len(requests), cause)
        yield Deliver(tuple(events))
        yield from self._release(requests)

    def _settle(self, plan: StepPlan, result: StepResult) -> Effects:
        """Apply a step's outcome: (finished, failed, output tokens)."""
        in_step = list(dict.fromkeys(c.request for c in plan.chunks if c.request in self.running))
        if result.error is None:
            try:
                events, finished = self.composer.apply(plan, result.tokens, result.pieces, result.eog,
                                                      result.t_sampled, result.logprobs)
            except Exception as exc:  # a bug in routing must not take the engine down with it
                in_step = [r for r in in_step if r in self.running]
                yield from self._fail(in_step, exc)
                return [], in_step, 0
            now = self.clock()
            for e in events:
                if e.event.index == 0 and e.event.token is not None:
                    e.request.t_first = now
                if e.event.final:
                    self.totals.finished[e.event.finish_reason] += 1
                    self._score(e.request, now)
            yield Deliver(tuple(events))
            if self.prefix is not None:
                yield from self._record(plan)  # before release: a request that just finished still holds its prompt
            yield from self._release(finished)
            if plan.rows is not None:  # a request that only scores its prompt ends with no token
                return finished, [], sum(1 for e in events if e.event.token is not None)
            return finished, [], len(events)
        if isinstance(result.error, NoKvSlotError):
            # nothing of the batch stayed in memory; sequences that could not be rolled back restart
            for r in in_step:
                if r.seq_id in result.lost:
                    r.cached = 0
            return [], [], 0
        yield from self._fail(in_step, result.error)
        return [], in_step, 0

    # -- latency targets (scheduling.slo) -------------------------------------------------

    def _mark_late_prompts(self, now: float) -> bool:
        """Whether steps are planned against targets; running prompts that could no longer make their first
        token in time are marked late (they stop taking budget from those that can)."""
        targets = self.tell_targets() if self.slo is not None else None
        if targets is None:
            return False
        if targets.advisory:
            return True  # nobody is late against a guess (scheduling.slo)
        for r in self.running:
            if not r.late and r.t_first is None and r.pending > 1 and self.slo.prefill_hopeless(r, now):
                r.late = True
        return True

    def tell_targets(self) -> Any:
        """The targets once resolved (scheduling.slo), said in one log line the first time."""
        targets = self.slo.resolve() if self.slo is not None else None
        if targets is not None and not self._targets_told:
            self._targets_told = True
            logger.info("latency targets: {}", targets.describe(self.slo.cost))
        return targets

    def _score(self, r: Request, now: float) -> None:
        """Count a finished request as within its targets or not (what goodput counts)."""
        targets = self.slo.resolve() if self.slo is not None else None
        if targets is None or r.t_first is None or r.finish_reason not in ("stop", "length"):
            return
        ok = r.t_first <= self.slo.first_deadline(r)
        n = len(r.generated)
        if ok and n > 1:
            ok = (now - r.t_first) / (n - 1) <= targets.tpot_s
        if ok:
            self.totals.slo_met += 1
        else:
            self.totals.slo_missed += 1

    # -- telemetry -----------------------------------------------------------------------

    def _report(
        self, n_running: int, plan: StepPlan, admitted: Sequence[Request], victims: Sequence[Request],
        finished: Sequence[Request], failed: Sequence[Request], outputs: int, result: StepResult,
        t_compose: float, t_sample: float, t_step: float,
    ) -> StepReport:
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
        self.totals.record(report, outputs)
        logger.debug("step {}: run={} wait={} +{} -{} fin={} prefill={} decode={} kv={} "
                     "compose={:.2f}ms decode={:.2f}ms sample={:.2f}ms",
                     report.step, report.running, report.waiting, report.admitted, report.preempted,
                     report.finished, report.prefill_tokens, report.decode_tokens, dict(report.kv_used),
                     1e3 * t_compose, 1e3 * result.t_decode, 1e3 * t_sample)
        return report
