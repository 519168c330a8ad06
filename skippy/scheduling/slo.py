"""Latency targets and what they decide: pure, no trio, no llama.

Goodput is the requests that meet both a TTFT and a TPOT target. On a CPU a prompt token costs
about what a decode row does, so batching buys little and the two levers are how much prefill
joins each step and how many sequences run at once. With targets known, each is a deadline:

- A running stream's k-th token (after its first) is due at t_first + k x tpot x MARGIN: the
  mean gap, which is what TPOT measures, stays within the target. Its slack to that deadline is
  what a step may spend on prefill (scheduling.budget); a stream ahead of its deadlines banks
  slack for a larger chunk later, at most STALL_TPOTS targets in one step (inter-token gaps stay
  bounded). TPOT is a mean, so the slack also counts BORROW of the headroom its tokens sure to come
  will have (the target pace minus a decode-only step's): a young stream far ahead of a loose
  target lends a prompt a step of its own instead of pinning every step to one target.
- A request's first token is due at t_arrival + ttft. Waiting requests go least slack first,
  priority before that (lower first, as in vLLM), and a request that can no longer meet its
  deadline is *late*: it stops taking budget from those that still can (it goes after them, no
  step is planned around it, and it decodes in the time on-time work leaves). Aging (one priority level per AGING_TTFTS targets waited) keeps
  anything from waiting forever behind a stream of others.
- Admission (scheduling.admission) lets a request start only while the decode rows of the
  running set plus its own leave its prefill time to finish by its deadline and every stream
  within its target; past that it waits, or becomes late when it is its turn and it could not make
  it. With `shed_late`, a late request is refused (429) at that moment instead of served late.

Targets not given are derived from this machine's step costs (the cost model, fed by the probe at
open): TPOT = TPOT_FACTOR x a one-row decode step, TTFT = TTFT_FACTOR x a request's own prompt
computed alone (a REFERENCE_PROMPT's, for a shorter one: a short prompt still waits its turn), the
gate's scaled SLO.

With neither target configured the derived ones are *advisory*: they shape steps, they do not hold
anyone back. Nobody is scored on a guess, and holding a request in the queue to keep a guessed
TPOT trades a wait the user sees for a gain nobody asked for: served closed-loop on falcon-h1
(bench/results/n8-after-0019-avx2) the hold-back gave a TTFT p99 5-10x llama-server's, lower
throughput and no lower ITL p99. So admission goes as memory and lanes allow (FCFS by priority),
nothing is marked late, and a step may always carry prefill beside its decode rows: the prompts in
flight spread over ADVISORY_SPREAD steps, as long as the step stays within ADVISORY_STALL_SHARE of
one that fills n_batch (llama-server's way; the ruling in #36: ITL p99 <= 0.25x llama-server's in
a closed burst). What was tried, served closed-loop at N=32 on falcon-h1 (chat), in
bench/results/advisory-targets: a chunk in proportion to the decodes (two decode-only steps a step)
fell to a few tokens with few streams running and the set settled at 3-5 (TTFT p50 41 s); a whole
REFERENCE_PROMPT a step gave ITL p99 0.29x; prompts spread over two or four steps (at most a
REFERENCE_PROMPT) 0.33x and 0.29x; the share of a full step kept here 0.27x (0.31x over two rounds).
A configured target holds steps to the target instead.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

import attrs

from .cost import MIN_SAMPLES, StepCostModel, StepShape, attended_kcells
from .requests import Request

TPOT_FACTOR = 5.0  # derived TPOT target: this many one-row decode steps
TTFT_FACTOR = 10.0  # derived TTFT target: this many times the request's prompt computed alone
REFERENCE_PROMPT = 128  # tokens: the prompt the derived TTFT is quoted for (log line, /metrics)
MARGIN = 0.95  # plan to this share of the TPOT target: the step loop's own time and noise take the rest
STALL_TPOTS = 2.0  # at most this many TPOT targets in one step, however much slack streams banked
AGING_TTFTS = 4.0  # waiting this many TTFT targets counts as one priority level better
LATE_LANES = 1  # late streams that decode every step whatever on-time work needs (so each one ends)
BORROW = 0.5  # share of a stream's sure headroom to come (target pace minus its decode pace) a step may spend now
LATE_STEP_TTFTS = 0.1  # with nothing on time to serve, a step of late work may take this share of a TTFT target
ADVISORY_SPREAD = 4  # advisory targets: a prompt's prefill goes over at least this many steps beside decodes
ADVISORY_STALL_SHARE = 0.25  # advisory targets: a step takes at most this share of one that fills n_batch


@attrs.frozen
class SloTargets:
    """The targets in seconds. `ttft_s` None: each request's own, TTFT_FACTOR x its prompt alone (at least
    a REFERENCE_PROMPT's)."""

    ttft_s: float | None
    tpot_s: float
    derived: bool = False

    @property
    def advisory(self) -> bool:
        """Neither target configured: they shape steps and hold nobody back (see the module's docstring)."""
        return self.derived and self.ttft_s is None

    def describe(self, cost: StepCostModel) -> str:
        ttft = (f"{1e3 * self.ttft_s:.0f} ms" if self.ttft_s is not None else
                f"{TTFT_FACTOR:g}x the prompt alone ({1e3 * reference_ttft(cost):.0f} ms at {REFERENCE_PROMPT} tokens)")
        how = (f"derived: TPOT {TPOT_FACTOR:g}x a one-row decode step ({1e3 * one_row(cost):.1f} ms)"
               if self.derived else "configured")
        role = ("; advisory: they shape steps, admission holds nobody back for them (configure either to"
                " plan admission for goodput)" if self.advisory else "")
        return f"TTFT {ttft}, TPOT {1e3 * self.tpot_s:.1f} ms ({how}){role}"


def one_row(cost: StepCostModel) -> float:
    return cost.seconds(StepShape(1, 0, attended_kcells(REFERENCE_PROMPT, 1), 0))


def reference_ttft(cost: StepCostModel) -> float:
    return TTFT_FACTOR * (cost.prefill_seconds(REFERENCE_PROMPT))


def sure_tokens(r: Request) -> int:
    """Tokens a stream will make after its next one, as far as a step may bet on them. TPOT is the mean gap,
    so a stall now can be made up by tokens to come that run faster than the target pace, but only by
    tokens that come: all of them when nothing but the length ends it (ignore_eos, no stop ids or strings),
    those before min_tokens, else no more than it has made so far (a stream that stops at its end token
    must not carry a stall bet on its max_tokens). Without it, the youngest stream pinned every step to
    one target however fast decodes ran: served under the seed's fixed SLO (TPOT 200 ms, TPOT p50 53 ms)
    at 0.8x capacity, TTFT p50 was 1.5x llama-server's and p99 1.9x."""
    left = max(0, r.remaining)
    sure = max(0, r.min_tokens - len(r.generated))
    if r.ignore_eos and not r.stop and not r.stop_ids:
        sure = left
    return max(0, max(sure, min(left, len(r.generated))) - 1)


def check_target(name: str, ms: float | None) -> float | None:
    """A target in ms from configuration, as seconds; None stays None (derive it)."""
    if ms is None:
        return None
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0 or not math.isfinite(ms):
        from ..errors import InvalidInputError

        raise InvalidInputError(f"{name} must be a positive number of milliseconds, got {ms!r}")
    return ms / 1000.0


@attrs.define
class SloPolicy:
    """The targets (configured, or derived once the cost model can) and the deadlines they set."""

    cost: StepCostModel = attrs.field(factory=StepCostModel)
    ttft_s: float | None = None  # configured; None: derived per request
    tpot_s: float | None = None  # configured; None: derived
    shed_late: bool = False
    targets: SloTargets | None = None  # resolved

    def resolve(self) -> SloTargets | None:
        """The targets, deriving what was not configured once the cost model has evidence (the probe's, or
        MIN_SAMPLES steps'); None until then (steps are planned without targets: they fill n_batch)."""
        if self.targets is None:
            if self.tpot_s is not None:
                self.targets = SloTargets(self.ttft_s, self.tpot_s, derived=False)
            elif self.cost.calibrated:
                self.targets = SloTargets(self.ttft_s, TPOT_FACTOR * one_row(self.cost), derived=True)
        return self.targets

    def calibrate(self, samples: Sequence[tuple[StepShape, float]]) -> None:
        """Steps timed before serving (the probe at open): the model learns them and takes its fit as the
        prior, so a direction later steps do not vary keeps this machine's value, not a guess."""
        for shape, seconds in samples:
            self.cost.observe(shape, seconds)
        if samples:
            self.cost.set_prior(self.cost.theta())
            self.cost.samples = max(self.cost.samples, MIN_SAMPLES)

    # -- deadlines ------------------------------------------------------------------

    def first_deadline(self, r: Request) -> float:
        """When its first token is due (set once, the first time it is asked)."""
        if r.deadline is None:
            t = self.resolve()
            ttft = t.ttft_s if t is not None and t.ttft_s is not None else None
            if ttft is None:
                ttft = TTFT_FACTOR * self.cost.prefill_seconds(max(int(r.prompt.size), REFERENCE_PROMPT))
            r.deadline = r.t_arrival + ttft
        return r.deadline

    def token_deadline(self, r: Request, tpot_s: float) -> float:
        """When its next token is due: the mean gap since its first stays within MARGIN x the target."""
        return r.t_first + len(r.generated) * tpot_s * MARGIN

    def update_stream(self, r: Request, now: float, tpot_s: float) -> None:
        """Mark a decoding stream late once no pace can bring its mean gap back within the target: even
        decode-only steps from now on would leave it over."""
        if r.late or r.t_first is None:
            return
        if r.deadline is not None and r.t_first > r.deadline:
            r.late = True  # its first token missed: whatever its pace, it is not within the targets
            return
        done = len(r.generated)
        total = done + max(0, r.remaining)
        if total < 2:
            return
        best = (now - r.t_first) + max(0, r.remaining) * self.cost.seconds(StepShape(1, 0, 0.0, 0))
        if best > (total - 1) * tpot_s:
            r.late = True

    def prefill_hopeless(self, r: Request, now: float) -> bool:
        """Even computed alone from now, its first token would be after its deadline."""
        return now + self.cost.prefill_seconds(max(1, r.pending), r.cached) > self.first_deadline(r)

    # -- the step ---------------------------------------------------------------------

    def step_seconds(self, decoding: Sequence[Request], now: float, waiting_on_time: bool,
                     borrow: bool = True, prompts: int | None = None, n_batch: int | None = None) -> float:
        """How long the next step may take: the least slack of the on-time streams (at least nothing, at
        most STALL_TPOTS targets; a stream's slack counts BORROW of the headroom its sure tokens to come
        will have, see sure_tokens; `borrow` False: banked slack only, what late rows may have); with no on-time stream, as long as prompts that can still make their
        first-token deadline need (unbounded), else late_step_seconds: a backlog of late work drains at
        batch throughput, not one TPOT target's worth a step. Advisory targets: nobody is marked late, and
        the step may always take advisory_step_seconds (`prompts`, `n_batch`: what it needs)."""
        t = self.resolve()
        if t is None:
            return math.inf
        slack = math.inf
        pace = MARGIN * t.tpot_s
        decode = None  # a decode-only step of these rows: the pace a stream catches up at (asked once)
        advisory = t.advisory
        for r in decoding:
            if r.t_first is None:
                continue  # its first token (a fork, a prompt shared whole): its deadline is the TTFT one
            if not advisory:
                self.update_stream(r, now, t.tpot_s)
            if not r.late:
                own = self.token_deadline(r, t.tpot_s) - now
                if borrow and own < slack:  # only a stream that may bind needs its headroom
                    n = sure_tokens(r)
                    if n > 0:
                        if decode is None:
                            decode = self.cost.seconds(self.decode_shape(decoding))
                        own += BORROW * n * max(0.0, pace - decode)
                slack = min(slack, own)
        if slack == math.inf:
            return math.inf if waiting_on_time else self.late_step_seconds(t)
        seconds = min(max(slack, 0.0), STALL_TPOTS * t.tpot_s)
        if advisory and decoding:
            seconds = max(seconds, self.advisory_step_seconds(decoding, prompts, n_batch))
        return seconds

    def advisory_step_seconds(self, decoding: Sequence[Request], prompts: int | None = None,
                              n_batch: int | None = None) -> float:
        """What a step may always take under advisory targets: its decode rows and, beside them, the
        prompts in flight (`prompts`: their tokens, whole; None: a REFERENCE_PROMPT's worth) spread over
        ADVISORY_SPREAD steps, within ADVISORY_STALL_SHARE of a step that fills `n_batch` (the module's
        docstring)."""
        shape = self.decode_shape(decoding)
        rows, kcells = shape.decode_rows, shape.attended_kcells

        def with_prompt(n: int) -> float:
            return self.cost.seconds(StepShape(rows, n, kcells + attended_kcells(0, n), 1))

        want = with_prompt(REFERENCE_PROMPT if prompts is None else -(-prompts // ADVISORY_SPREAD))
        if n_batch is None or n_batch <= rows:
            return want
        return min(want, ADVISORY_STALL_SHARE * with_prompt(n_batch - rows))

    def late_step_seconds(self, t: SloTargets) -> float:
        """A step when only late work is left: LATE_STEP_TTFTS of a TTFT target (at least one TPOT target).
        Late prompts then go in chunks a matmul runs well, beside the late rows, while a request arriving
        meanwhile waits at most that share of its own TTFT for the step in flight to end."""
        ttft = t.ttft_s if t.ttft_s is not None else reference_ttft(self.cost)
        return max(t.tpot_s, LATE_STEP_TTFTS * ttft)

    def decode_shape(self, decoding: Sequence[Request]) -> StepShape:
        return StepShape(len(decoding), 0, sum(r.cached + 1 for r in decoding) / 1000.0, 0)

    # -- admission ----------------------------------------------------------------------

    def gate(self, running: Sequence[Request], now: float) -> "SloGate | None":
        """What admission needs this step, or None while there are no targets, while they are advisory, or while
        the cost model has too little evidence to predict with (admit as memory allows: a guess must not
        hold back or shed anyone)."""
        t = self.resolve()
        if t is None or not self.cost.calibrated or t.advisory:
            return None
        cells = backlog = late = 0
        ends: list[int] = []
        for r in running:  # one pass: this runs every step that asks admission
            if r.late:
                late += 1
            else:
                cells += r.n_tokens
                backlog += max(0, r.pending - 1)
                ends.append(max(1, r.remaining))
        ends.sort()
        return SloGate(self, t.tpot_s, now, len(running), cells / 1000.0, backlog, late, ends)


@attrs.define
class SloGate:
    """The running set as admission sees it this step; `take` keeps it current as it admits."""

    policy: SloPolicy
    tpot_s: float
    now: float
    rows: int  # sequences running (each decodes every step once its prompt is in)
    kcells: float  # cells the on-time ones attend, in thousands
    backlog: int  # prompt tokens on-time running requests still have to compute
    late: int = 0  # running requests that are late
    ends: list[int] = attrs.field(factory=list)  # the on-time ones' tokens left to generate, ascending

    @property
    def on_rows(self) -> int:
        """The rows each step must carry: on-time streams, and the LATE_LANES late ones that always decode
        (the rest decode only in time on-time work leaves, scheduling.budget.TokenBudget.rows)."""
        return self.rows - self.late + min(self.late, LATE_LANES)

    def late_room(self, free_lanes: int, ceiling: int) -> bool:
        """A late request may start while the lanes left after it still hold as many on-time streams as the
        target allows (at most half the lanes: late ones always have the other half). It decodes only in
        time on-time work leaves, but a lane it holds is one an on-time arrival cannot have (when late
        requests took every lane, on-time arrivals waited and went late in turn: a collapse that feeds
        itself, seen served at 1x capacity)."""
        return free_lanes - 1 >= min(self.max_rows(), ceiling // 2) - (self.rows - self.late)

    def row_kcells(self) -> float:
        """The cells a row attends, in thousands: the on-time rows' mean (a REFERENCE_PROMPT's with none)."""
        on = self.rows - self.late
        return self.kcells / on if on else REFERENCE_PROMPT / 1000.0

    def max_rows(self) -> int:
        """The most rows a decode-only step of this running set can have within MARGIN x the TPOT target,
        each row with its cells (rows like the on-time ones)."""
        cost = self.policy.cost
        base = cost.seconds(StepShape(0, 0, 0.0, 0))
        return max(1, int((MARGIN * self.tpot_s - base) / cost.per_decode_row(self.row_kcells())))

    def decode_room(self, r: Request | None = None) -> bool:
        """One more on-time stream (`r`, or one like the running ones) keeps a decode-only step within MARGIN
        x the TPOT target, its own cells counted: leaving them out let a fit that priced rows by their cells
        admit rows for free (served on falcon-h1: the TPOT of streams admitted on time went to 480 ms)."""
        if self.rows == self.late:
            return True  # nothing on time runs (an idle engine, or targets nobody can meet): nobody to protect
        own = (r.n_tokens + 1) / 1000.0 if r is not None else self.row_kcells()
        shape = StepShape(self.on_rows + 1, 0, self.kcells + own, 0)
        return self.policy.cost.seconds(shape) <= MARGIN * self.tpot_s

    def first_token_eta(self, r: Request) -> float:
        """When `r`'s first token would come if admitted now: its prompt after the on-time backlog, at the
        prefill rate steps leave beside the decode rows (each step MARGIN x the target long), the rows
        thinning as the running streams reach their ends (a stream ends after its `remaining` steps;
        once none is left the prompt runs at full speed). Counting every running row to the end made a
        request arriving behind a few short streams look hopeless when they were about to finish: served
        at 0.5x capacity it was marked late and served 6 s after arriving, behind later arrivals that
        made their 4 s target. Each running request counts from now (a prefilling one's row starts later:
        optimistic by that much), and `r`'s own row only after its first token, outside this estimate."""
        cost = self.policy.cost
        tokens = self.backlog + max(1, r.pending)
        if self.rows == self.late:  # late streams yield to its prompt (scheduling.budget)
            return self.now + cost.prefill_seconds(tokens, r.cached)
        step = MARGIN * self.tpot_s
        always = min(self.late, LATE_LANES)  # late rows that decode every step, whatever their length
        ends, n = self.ends, len(self.ends)
        t, done, i = self.now, 0, 0
        while True:
            while i < n and ends[i] <= done:
                i += 1
            rows = n - i + always
            if rows == 0:
                return t + cost.prefill_seconds(tokens, r.cached)
            per_step = cost.prefill_for(step, StepShape(rows, 0, self.kcells * (n - i) / max(1, n), 0), r.cached)
            if per_step <= 0 and done == 0:
                return math.inf  # the decode rows leave no prefill time now (admission waits for a stream to end)
            if i == n:  # only late rows are left: they never end here
                return t + math.ceil(tokens / per_step) * step if per_step > 0 else math.inf
            span = ends[i] - done  # steps until the next stream ends
            if per_step > 0 and tokens <= per_step * span:
                return t + math.ceil(tokens / per_step) * step
            tokens -= max(0, per_step) * span
            t += span * step
            done += span

    def on_time(self, r: Request) -> bool:
        return self.first_token_eta(r) <= self.policy.first_deadline(r)

    def take(self, r: Request) -> None:
        self.rows += 1
        self.late += r.late
        if not r.late:
            self.kcells += r.n_tokens / 1000.0
            self.backlog += max(0, r.pending - 1)
            bisect.insort(self.ends, max(1, r.remaining))
