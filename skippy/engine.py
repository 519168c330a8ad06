"""The embedded API: `async with open_engine(model, **config) as engine:` then `engine.generate(...)`.

The engine's actors live in a nursery opened inside the caller's task tree, so they
cannot outlive it; the one worker thread is joined and the context closed on exit.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from pathlib import Path
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import attrs
import numpy as np
import trio
from loguru import logger

from ._dry import table_pairs
from ._plan import pool_cells
from .actors._mail import Tap, deliver, poke
from .actors.admission import AdmissionActor
from .actors.composer import ComposerActor
from .actors.messages import Wake
from .actors.preemption import PreemptionActor
from .actors.runtime_owner import RuntimeOwner
from .actors.worker import Worker
from .errors import EngineBusyError, EngineClosedError, InvalidInputError, StreamStateError
from .runtime import ContextRuntime, Runtime
from .sampling import SamplingParams
from .scheduling.admission import Admission, fcfs_priority
from .scheduling.lanes import LanePlan
from .scheduling.logprobs import MAX_TOP
from .scheduling.preemption import Preemption, VictimOrder
from .scheduling.prefix import PrefixCache
from .scheduling.requests import Request, TokenEvent, cancelled_event, check_ends, validate
from .scheduling.budget import TokenBudget
from .scheduling.slo import SloPolicy, check_target, reference_ttft
from .scheduling.step import StepScheduler
from .telemetry import EngineStats, StepReport, make_stats

BREAKER_TABLES = 16  # DRY breaker lists whose tables an engine keeps (a client cannot grow it past this)


@attrs.frozen(kw_only=True)
class EngineConfig:
    # the shared cell pool (unified KV: any one sequence may use all of it); None: 4096, or derived
    # from memory_bytes when that is given
    n_ctx: int | None = None
    n_batch: int = 512  # tokens per step (decode + prefill chunks); also n_ubatch: one ubatch per step
    n_seq_max: int | None = None  # ceiling on running sequences; None = derived (scheduling.lanes)
    memory_bytes: int | None = None  # budget for KV cells and recurrent states; sizes n_ctx and the ceiling
    threads: int | None = None
    max_waiting: int = 256  # past it, generate() fails fast with OverloadedError
    decode_reserve: int = 16  # cells promised per running sequence beyond its prompt
    max_preemptions: int = 3  # then the request is pinned (never preempted again)
    victim_policy: str | VictimOrder = "newest"  # or "fewest_outputs", or a sort key
    priority_key: Callable[[Request], tuple] = fcfs_priority
    floor_ctx_per_session: int = 128
    # Prefix reuse (scheduling.prefix): prompts are kept on `prefix_slots` reserved sequence ids
    # and shared into new requests with seq_cp; running requests are sources too.
    prefix_cache: bool = True
    prefix_slots: int = 8  # resident entries (sequence ids kept off the lanes)
    prefix_budget_tokens: int | None = None  # resident tokens; None = half the cell pool
    prefix_block: int = 16  # hash-chain block size in tokens
    context_options: Mapping[str, Any] = attrs.field(factory=dict)  # extra ContextOptions fields
    # On by default: exact-output parity (a request's tokens do not depend on its batch-mates)
    # is the pre-gate. Measured cost (bench/results/batch-invariance): decode within noise of
    # the default kernels, prefill slower where no repacked weights cover the type; attention in
    # blocks of a row's own cells (patch 0020, AVX2) brought a Q4_1 prompt to the default
    # kernels' time (bench/results/prefill-q41-avx2).
    batch_invariant: bool = True
    # The batch-invariance self-check (skippy.check) of the model on this build, when batch_invariant:
    # "cached" reads a stored verdict only (opens stay fast; none: unverified), "run" runs the check
    # when none is stored (seconds on a small model), "require" also refuses a model that fails
    # (InvarianceError), "off" skips it. The verdict is Engine.invariance and /metrics' skippy_batch_invariant.
    verify_invariance: str = "cached"
    # Latency targets (scheduling.slo): every step and every admission is planned against them. None:
    # derived at open from this machine's step costs (TPOT 5x a one-row decode step, TTFT 10x the
    # request's prompt computed alone), said in one log line and shown in stats() and /metrics.
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    # A request that can no longer meet its TTFT target when its turn comes is refused (LateRequestError,
    # HTTP 429 + Retry-After) instead of served late; off: it is served after the on-time ones.
    shed_late: bool = False
    # False: no targets and no budget (every step may fill n_batch, admission by memory alone)
    slo_scheduling: bool = True
    min_prefill_tokens: int = 1  # a mixed step always moves prompts by at least this much
    # Overlap steady decode steps (scheduling.step: the next step is launched before this one's
    # tokens are routed and streamed, so Python work runs while the model computes). Same outputs.
    overlap_steps: bool = True
    # Run-ahead (scheduling.run_ahead): while every running stream is read inline (a server's streams),
    # steady decode steps go on from the worker thread without waking the event loop. Same outputs.
    run_ahead: bool = True
    on_step: Callable[[StepReport], None] | None = None
    # Layers a GPU holds when the model is opened from a path (-1: all; needs `skippy build --cuda`;
    # a CPU build runs them on the CPU). Batch invariance is then the self-check's verdict
    # (Engine.invariance, run at open), not a guarantee.
    n_gpu_layers: int = 0


def _open_runtime(model: Any, cfg: EngineConfig) -> tuple[Runtime, LanePlan]:
    """A Runtime for `model` (a path, a name or a Model) and its lane plan; the model is closed on failure if opened here."""
    from .native import Model

    if model is None or isinstance(model, (str, os.PathLike)):
        from .models import resolve_model
        from .native import ensure_built

        ensure_built(progress=False)
        # repacked weights use kernels that are not batch-invariant, so invariant engines load without them
        m, own = Model(resolve_model(model), repack=not cfg.batch_invariant, n_gpu_layers=cfg.n_gpu_layers), True
    elif isinstance(model, Model):
        m, own = model, False
        if cfg.batch_invariant and m.repack:
            logger.warning("{} was loaded with repacked weights, whose kernels are not batch-invariant: "
                           "load it with Model(path, repack=False) for exact-output parity", m.path.name)
        if cfg.n_gpu_layers and cfg.n_gpu_layers != m.n_gpu_layers:  # a loaded Model keeps its own
            logger.warning("n_gpu_layers={} is ignored: {} was loaded with n_gpu_layers={}", cfg.n_gpu_layers,
                           m.path.name, m.n_gpu_layers)
    else:
        raise InvalidInputError(f"open_engine takes a GGUF path, a model name or a Model, got {type(model).__name__}; "
                                "a ready Runtime goes through open_engine_on(runtime, lanes)")
    try:
        plan, options = plan_engine(m, cfg, measure=False)
        runtime = ContextRuntime(m, options, own_model=own)
    except BaseException:
        if own:
            m.close()
        raise
    logger.info("engine: {} n_ctx={} n_batch={} ceiling={} ({})", m.arch, runtime.n_ctx, runtime.n_batch,
                plan.ceiling, plan.reason)
    _note_offload(m, cfg)
    return runtime, plan


def _note_offload(model: Any, cfg: EngineConfig) -> None:
    """Say where the layers run: skippy makes its CPU kernels batch-invariant, not a GPU's."""
    from .native._devices import offloads

    if not model.n_gpu_layers:
        return
    if not offloads(model.n_gpu_layers):
        logger.info("n_gpu_layers={}: this native build has no GPU device; every layer runs on the CPU",
                    model.n_gpu_layers)
    elif cfg.batch_invariant:
        logger.warning("{}: n_gpu_layers={} puts layers on a GPU, whose kernels are not made batch-invariant: "
                       "outputs may depend on the batch; Engine.invariance holds the self-check's verdict",
                       model.path.name, model.n_gpu_layers)


def plan_engine(model: Any, cfg: EngineConfig, *, measure: bool = True, cells_cap: int | None = None,
                lanes_cap: int | None = None, split: int = 1) -> tuple[LanePlan, Any]:
    """The lane plan of `cfg` over a loaded Model and the ContextOptions to open it with: what
    open_engine opens, what a pipeline's stage 0 opens (capped by what the stages below hold,
    divided among its `split` groups) and what `skippy plan` prints (skippy._plan.size_context)."""
    from ._plan import size_context

    return size_context(model, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, threads=cfg.threads,
                        batch_invariant=cfg.batch_invariant, memory_bytes=cfg.memory_bytes, n_seq_max=cfg.n_seq_max,
                        floor_ctx_per_session=cfg.floor_ctx_per_session, reserved=_reserved(cfg),
                        prefix_fraction=_prefix_fraction(cfg, pool_cells(cfg.n_ctx, cfg.memory_bytes)),
                        context_options=cfg.context_options, cells_cap=cells_cap, lanes_cap=lanes_cap, split=split,
                        measure=measure)


def _reserved(cfg: EngineConfig) -> int:
    if cfg.prefix_slots < 0 or cfg.prefix_block < 1:
        raise InvalidInputError("prefix_slots must be >= 0 and prefix_block >= 1")
    return cfg.prefix_slots if cfg.prefix_cache else 0


def _prefix_fraction(cfg: EngineConfig, n_ctx: int | None) -> float:
    """The prefix cache's share of the cell pool (a co-tenant): half by default."""
    if not cfg.prefix_cache:
        return 0.0
    if cfg.prefix_budget_tokens is None or not n_ctx:
        return 0.5
    return min(1.0, cfg.prefix_budget_tokens / n_ctx)


def _prefix_cache(runtime: Runtime, cfg: EngineConfig, plan: LanePlan) -> PrefixCache | None:
    if not cfg.prefix_cache or plan.n_seq_max <= plan.ceiling or getattr(runtime, "prefix_identity", None) is None:
        return None
    budget = cfg.prefix_budget_tokens if cfg.prefix_budget_tokens is not None else plan.prefix_budget_tokens
    return PrefixCache(runtime.prefix_identity, range(plan.ceiling, plan.n_seq_max), budget,
                       block=cfg.prefix_block, exact=runtime.share_exact)


class GenerationStream:
    """Async iterator of a request's TokenEvents; the last one has finish_reason and usage.

    Leaving it early (cancelled scope, break + aclose, context exit, garbage) cancels the
    request: it leaves the queue, or its cells are freed at the next step.
    """

    def __init__(self, engine: "Engine", request: Request, events: trio.MemoryReceiveChannel,
                 submitted: trio.MemoryReceiveChannel) -> None:
        self._engine = engine
        self.request = request
        self._events = events
        self._submitted: trio.MemoryReceiveChannel | None = submitted
        self._done = False
        self._tap: Tap | None = None
        self._first: TokenEvent | None = None  # read ahead by first_event(), not yet given to the reader

    def __aiter__(self) -> "GenerationStream":
        return self

    async def queued(self) -> None:
        """Wait until admission took the request into its queue; raises OverloadedError if it is full.

        A server answers 429 from here before it commits to a response."""
        try:
            await self._await_submission()
        except trio.Cancelled:
            self.cancel()
            raise

    async def _await_submission(self) -> None:
        if self._submitted is not None:
            try:
                answer = await self._submitted.receive()
            except trio.EndOfChannel:
                answer = None  # engine closing: the events channel says how it ended
            self._submitted = None
            if answer is not None:
                self._done = True
                self._engine._forget(self.request)
                raise answer

    async def first_event(self) -> TokenEvent | None:
        """Wait for the first event and keep it for the reader (who still gets it first); None if the stream
        ended without one. A server answers a refusal that comes only once the request is queued (shed as
        late: `shed_late`) as an HTTP status from here, before it commits to a streamed response."""
        if self._first is None and not self._done:
            try:
                self._first = await self.__anext__()
            except StopAsyncIteration:
                return None
        return self._first

    async def __anext__(self) -> TokenEvent:
        if self._first is not None:  # read ahead by first_event(): its end, if it was one, is accounted
            event, self._first = self._first, None
            return event
        try:
            await self._await_submission()
            if self._done:
                raise StopAsyncIteration
            tap = self._tap
            if tap is not None and tap.take is not None and not self._events.statistics().current_buffer_used:
                tap.armed = True  # waiting with nothing queued: the next events may be taken inline
            try:
                event = await self._events.receive()
            except trio.EndOfChannel:
                self._done = True
                raise StopAsyncIteration from None
            finally:
                if tap is not None:
                    tap.armed = False
        except trio.Cancelled:
            self.cancel()
            raise
        if event.final:
            self._done = True
            self._engine._forget(self.request)
        return event

    async def batch(self) -> list[TokenEvent]:
        """The next event and every one already queued behind it (in order, each once): a reader that
        fell behind (a slow client) catches up in one write instead of one per token. Empty when the
        stream has ended."""
        try:
            first = await self.__anext__()
        except StopAsyncIteration:
            return []
        events = [first]
        while not events[-1].final:
            try:
                event = self._events.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            events.append(event)
            if event.final:
                self._done = True
                self._engine._forget(self.request)
        return events

    def divert(self, take: Callable[[TokenEvent], bool]) -> None:
        """From now on, while this stream's reader waits with nothing queued, each event but the last
        goes to `take` in the step that produced it, and the reader is not woken for it. An event it
        refuses (False), and those after it until the reader waits again, queue as before: each event
        is read or taken once, in order. For a server that writes a token's bytes from the step
        (server._inline_writes): one task wake-up and one trip down the ASGI send chain less per token."""
        if self._tap is not None or self.request.sink is None:
            raise StreamStateError("this stream is diverted already, or has ended")
        self._tap = Tap(take, self.request.sink)
        self.request.sink = self._tap

    def cancel(self) -> None:
        if self._done:
            return
        self._done = True
        self._engine._cancel(self.request)

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> "GenerationStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:
            pass


@attrs.frozen
class Policies:
    """The pure scheduler of an engine: what the actors drive, and what skippy.testing drives synchronously."""

    admission: Admission
    preemption: Preemption
    scheduler: StepScheduler


def build_policies(runtime: Runtime, cfg: EngineConfig, plan: LanePlan, clock: Callable[[], float] = time.perf_counter
                   ) -> Policies:
    scheduler = StepScheduler(runtime.n_batch, cfg.decode_reserve, runtime.ledger(), _prefix_cache(runtime, cfg, plan),
                              budget=_token_budget(runtime.n_batch, cfg), overlap=bool(cfg.overlap_steps),
                              run_ahead=bool(cfg.run_ahead), clock=clock,
                              exact=bool(getattr(runtime, "share_exact", False)),
                              equal_split=bool(getattr(runtime, "equal_split", False)))
    exact = bool(getattr(runtime, "share_exact", False))
    return Policies(Admission(plan.ceiling, cfg.max_waiting, cfg.decode_reserve, cfg.priority_key, exact),
                    Preemption(cfg.victim_policy, cfg.max_preemptions), scheduler)


def _token_budget(n_batch: int, cfg: EngineConfig) -> TokenBudget:
    ttft, tpot = check_target("ttft_slo_ms", cfg.ttft_slo_ms), check_target("tpot_slo_ms", cfg.tpot_slo_ms)
    if cfg.shed_late and ttft is None and tpot is None and cfg.slo_scheduling:
        from .errors import InvalidInputError

        # derived targets are advisory (scheduling.slo): nobody is late against them, so nothing would be shed
        raise InvalidInputError("shed_late needs a latency target to shed against: give ttft_slo_ms or "
                                "tpot_slo_ms (--ttft-slo-ms / --tpot-slo-ms)")
    slo = SloPolicy(ttft_s=ttft, tpot_s=tpot, shed_late=bool(cfg.shed_late)) if cfg.slo_scheduling else None
    return TokenBudget(n_batch, slo, min_prefill=max(1, int(cfg.min_prefill_tokens)))


def _ttft_shown(slo: SloPolicy | None) -> float | None:
    """The TTFT target as stats show it: the configured one, or the derived one of a REFERENCE_PROMPT."""
    if slo is None or slo.targets is None:
        return None
    return slo.targets.ttft_s if slo.targets.ttft_s is not None else reference_ttft(slo.cost)


def policy_stats(p: Policies, ceiling: int) -> EngineStats:
    """The engine's stats from its policies' state now."""
    s, prefix = p.scheduler, p.scheduler.prefix
    targets = s.slo.targets if s.slo is not None else None
    return make_stats(
        s.totals, ceiling=ceiling, running=len(s.running), waiting=len(p.admission.waiting), ledger=s.ledger,
        submitted=p.admission.submitted, admitted=p.admission.admitted, rejected=p.admission.rejected,
        preemptions=p.preemption.total, cancelled_waiting=p.admission.cancelled,
        prefix_entries=len(prefix.entries) if prefix else 0,
        prefix_resident_tokens=prefix.resident_tokens if prefix else 0,
        slo_ttft_s=_ttft_shown(s.slo), slo_tpot_s=targets.tpot_s if targets else None,
        slo_shed=p.admission.shed, running_tokens=sum(r.cached for r in s.running))


class Engine:
    def __init__(self, runtime: Runtime, cfg: EngineConfig, plan: LanePlan, pipeline: Any = None) -> None:
        self.runtime = runtime
        self.config = cfg
        self.lanes = plan
        self.pipeline = pipeline  # a pipeline's stage 0: what it learnt from the chain (staged.PipelineInfo)
        self.invariance: Any = None  # the batch-invariance check's CheckResult (skippy.check); None: unverified
        self._ids = itertools.count()
        self._live: dict[int, tuple[Request, trio.MemorySendChannel]] = {}
        self._closed = False
        self._eog_ids: np.ndarray | None = None  # the vocabulary's end-of-generation ids (min_tokens)
        self._breakers: dict[tuple[str, ...], tuple] = {}  # DRY's breaker tables, per breaker list
        self._runtime_tx, runtime_rx = trio.open_memory_channel(math.inf)
        self._composer_tx, composer_rx = trio.open_memory_channel(math.inf)
        self.worker = Worker()
        # a runtime may bring its own clock (skippy.testing's fake: time passes as its steps report it)
        self._policies = build_policies(runtime, cfg, plan, clock=getattr(runtime, "clock", time.perf_counter))
        self._owner = RuntimeOwner(runtime, self.worker, runtime_rx)
        self._admission = AdmissionActor(self._policies.admission, self._composer_tx)
        self._preemption = PreemptionActor(self._policies.preemption, self._owner, self._admission)
        self._composer = ComposerActor(self._policies.scheduler, composer_rx, self._owner, self._admission,
                                       self._preemption, cfg.on_step)

    def _breaker_pairs(self, breakers: tuple[str, ...]) -> tuple:
        """DRY's restart sequences for `breakers` over this model's vocabulary, built once per list (the
        first scan reads every token's text: ~0.16 s for SmolLM2's 49k tokens) and kept (at most BREAKER_TABLES)."""
        pairs = self._breakers.get(breakers)
        if pairs is None:
            build = getattr(self.runtime, "breaker_table", None)
            if build is None:
                raise InvalidInputError("this runtime cannot read its vocabulary for DRY's sequence breakers: "
                                        "give dry_sequence_breakers [] (no breakers)")
            t0 = time.perf_counter()
            pairs = table_pairs(build(breakers))
            if len(self._breakers) >= BREAKER_TABLES:
                self._breakers.pop(next(iter(self._breakers)))
            self._breakers[breakers] = pairs
            logger.info("DRY: {} restart sequences for breakers {!r} ({:.0f} ms)", len(pairs), breakers,
                        1000 * (time.perf_counter() - t0))
        return pairs

    def _start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._owner.run, name="skippy.runtime_owner")
        nursery.start_soon(self._composer.run, name="skippy.composer")

    # -- public -----------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int] | np.ndarray,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        *,
        max_tokens: int = 64,
        stop: str | Sequence[str] = (),
        priority: int = 0,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        grammar: Any = None,
        min_tokens: int = 0,
        stop_token_ids: Sequence[int] = (),
        include_stop_str_in_output: bool = False,
    ) -> GenerationStream:
        """Queue a generation now; iterate the result for its TokenEvents.

        `logprobs=k` (0..20) puts each sampled token's TokenLogprob (with its k most likely alternatives)
        on its event; `prompt_logprobs=k` scores the prompt too (the first event carries a TokenLogprob per
        prompt token after the first; such a request computes its whole prompt, never sharing a prefix),
        and allows `max_tokens=0`: the prompt scored, nothing generated. Both are the raw model's
        log-softmax (before penalties, bias and temperature).

        Bad input raises here (named InvalidInputError subclasses); a full queue raises
        OverloadedError from the first iteration (or from `await stream.queued()`).
        `ignore_eos=True` keeps generating past end-of-generation tokens (benchmarks).
        `grammar` (a skippy.constrain.Grammar, from `constrain.compile_grammar(engine.runtime, spec)`)
        constrains the output: each choice gets its own matcher.
        vLLM's three: `stop_token_ids` finish it when sampled (finish_reason "stop", even with
        ignore_eos); before `min_tokens` tokens no end-of-generation or stop id can be sampled (their
        logits are -inf, the others untouched) and no stop string is looked for;
        `include_stop_str_in_output` keeps a stop string found in the text.
        """
        return self.generate_choices(prompt, sampling, n=1, max_tokens=max_tokens, stop=stop, priority=priority,
                                     ignore_eos=ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                     grammar=grammar, min_tokens=min_tokens, stop_token_ids=stop_token_ids,
                                     include_stop_str_in_output=include_stop_str_in_output)[0]

    def generate_choices(
        self,
        prompt: str | Sequence[int] | np.ndarray,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        *,
        n: int,
        max_tokens: int = 64,
        stop: str | Sequence[str] = (),
        priority: int = 0,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        grammar: Any = None,
        min_tokens: int = 0,
        stop_token_ids: Sequence[int] = (),
        include_stop_str_in_output: bool = False,
    ) -> list[GenerationStream]:
        """`n` choices of one prompt (OpenAI's `n`), a stream each: the prompt is computed once and its
        cells shared by every choice (scheduling.forks). Choice i samples with seed + i when a seed is
        given, so it equals the same request with n=1 and that seed. Only choice 0 scores the prompt
        (`prompt_logprobs`). Cancel every stream to cancel the request."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInputError(f"n must be an integer >= 1, got {n!r}")
        if isinstance(sampling, Mapping):
            sampling = SamplingParams(**sampling)
        sampling = sampling or SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise InvalidInputError(f"sampling must be SamplingParams or a dict, got {type(sampling).__name__}")
        if sampling.needs_breakers:
            sampling = attrs.evolve(sampling, dry_breakers=self._breaker_pairs(sampling.dry_sequence_breakers))
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        if not all(isinstance(s, str) for s in stops):
            raise InvalidInputError("stop must be a string or a sequence of strings")
        if not isinstance(priority, int):
            raise InvalidInputError(f"priority must be an integer, got {priority!r}")
        for name, k in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP):
                raise InvalidInputError(f"{name} must be an integer in [0, {MAX_TOP}] or None, got {k!r}")
        tokens = self.runtime.tokenize(prompt) if isinstance(prompt, str) else prompt
        tokens = validate(tokens, max_tokens, self.runtime.n_ctx, self.runtime.n_vocab,
                          scoring=prompt_logprobs is not None and n == 1)
        ends = check_ends(min_tokens, stop_token_ids, int(max_tokens), self.runtime.n_vocab)
        held = self._held_ids(ends, bool(ignore_eos)) if min_tokens else None
        streams: list[GenerationStream] = []
        parent: Request | None = None
        for i in range(n):
            rid = next(self._ids)
            params = sampling if i == 0 or sampling.seed is None else attrs.evolve(sampling, seed=sampling.seed + i)
            request = Request(rid, tokens, int(max_tokens), params, priority, stops, arrival=rid,
                              ignore_eos=bool(ignore_eos), logprobs=logprobs,
                              prompt_logprobs=prompt_logprobs if i == 0 else None, fork_of=parent, choice=i,
                              t_arrival=self._policies.scheduler.clock(), stop_ids=ends, min_tokens=int(min_tokens),
                              include_stop=bool(include_stop_str_in_output))
            if held is not None:
                request.sampler.hold_ends(held, int(min_tokens))
            if grammar is not None:  # its own matcher per choice (skippy.constrain)
                request.sampler.constraint = grammar.constraint()
            parent = parent or request
            events_tx, events_rx = trio.open_memory_channel(math.inf)
            request.sink = events_tx
            submit_tx, submit_rx = trio.open_memory_channel(1)
            self._live[rid] = (request, submit_tx)
            self._admission.submit(request, submit_tx)
            streams.append(GenerationStream(self, request, events_rx, submit_rx))
        self._composer.unpark()
        return streams

    def _held_ids(self, stop_ids: frozenset[int], ignore_eos: bool) -> np.ndarray:
        """What min_tokens holds out: the stop ids, and the vocabulary's end-of-generation ids unless
        ignore_eos (vLLM's MinTokensLogitsProcessor); the end ids found once, on first use."""
        if self._eog_ids is None:
            found = getattr(self.runtime, "eog_ids", None)
            self._eog_ids = (found() if found is not None else
                             np.array([t for t in range(self.runtime.n_vocab) if self.runtime.is_eog(t)], np.int64))
        ids = set(stop_ids) | (set() if ignore_eos else set(self._eog_ids.tolist()))
        return np.array(sorted(ids), dtype=np.int64)

    @property
    def n_ctx(self) -> int:
        return self.runtime.n_ctx

    @property
    def model_name(self) -> str:
        """The served model's name: its file's stem, or the runtime's architecture."""
        model = getattr(self.runtime, "model", None)
        return Path(model.path).stem if model is not None else self.runtime.arch

    @property
    def has_chat_template(self) -> bool:
        return getattr(self.runtime, "model", None) is not None

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> np.ndarray:
        """Chat messages through the GGUF's own template (Jinja, skippy.chat_template), ready to generate
        from (an assistant turn opened); `tools` (OpenAI's function tools) rendered as the template expects,
        `template_kwargs` passed to it.

        Raises InvalidInputError when the runtime has no model (a fake) or the template refuses them."""
        from .chat_template import render, strip_bos

        model = getattr(self.runtime, "model", None)
        if model is None:
            raise InvalidInputError("this engine has no model with a chat template")
        text = strip_bos(model, render(model, messages, tools=tools, template_kwargs=template_kwargs))
        return model.tokenizer.tokenize(text, add_special=True, parse_special=True)

    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray:
        return self.runtime.tokenize(text, add_special)

    @property
    def step_in_flight(self) -> bool:
        """Whether the next step already computes while the last one's tokens are routed (chained
        decoding): what a token's reader does now overlaps the decode instead of delaying its launch."""
        return self._owner.computing

    def after_next_step_start(self, fn: Callable[[], None]) -> None:
        """Run `fn` (sync, quick) once, right after the engine hands its next step to the worker thread,
        or before it waits with no step to run: a token's reader that is called while no step computes
        (`step_in_flight` false) does its work there, beside the decode instead of before it."""
        self._owner.after_next_start(fn)

    @property
    def live(self) -> int:
        """Requests generated and not yet finished (queued or running): a load figure."""
        return len(self._live)

    async def settled(self) -> None:
        """Wait until the engine has nothing to do: a stream's final event can reach its reader
        a step before that request's cells and lane are given back (the step that still holds
        it may be in flight); once settled, only resident prefixes hold memory."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._composer.parked.is_set():
            await self._composer.parked.wait()

    def latency_targets(self) -> str | None:
        """The latency targets steps are planned for, in words (configured or derived), or None (none yet)."""
        slo = self._policies.scheduler.slo
        targets = slo.resolve() if slo is not None else None
        return None if targets is None else targets.describe(slo.cost)

    def stats(self) -> EngineStats:
        """Computed from the scheduler's state now (between steps: cells a cancel freed show at once).
        The steps of a run ahead (`run_ahead`: inline-read streams only) count once it is collected,
        at most scheduling.run_ahead.RUN_STEPS steps later."""
        return policy_stats(self._policies, self.lanes.ceiling)

    async def flush_prefix_cache(self) -> int:
        """Drop every resident prefix and free its cells; returns how many entries were dropped. What
        SGLang's /flush_cache does to its radix cache (a router flushes every worker, e.g. after new
        weights, or before measuring cold prefills). Refused while requests run or wait, as SGLang's
        is: raises EngineBusyError (a running request may be about to copy from an entry)."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        if self._live:
            raise EngineBusyError(f"{len(self._live)} request(s) running or waiting: the prefix cache is flushed "
                                  "only when none are")
        answer: list[int | None] = []
        done = trio.Event()

        def flushed(n: int | None) -> None:
            answer.append(n)
            done.set()

        self._policies.scheduler.request_flush(flushed)  # carried out by the next step, on the composer's task
        self._composer.unpark()
        poke(self._composer_tx, Wake())
        await done.wait()
        if answer[0] is None:
            if self._closed:
                raise EngineClosedError("the engine closed before the prefix cache was flushed")
            raise EngineBusyError("a request started before the prefix cache could be flushed")
        return answer[0]

    # -- internals --------------------------------------------------------------------

    def _cancel(self, request: Request) -> None:
        request.cancel_requested = True
        self._forget(request)
        self._admission.cancel(request)
        poke(self._composer_tx, Wake())

    def _forget(self, request: Request) -> None:
        self._live.pop(request.id, None)

    def _abandon(self) -> None:
        """After the actors are gone: every live request ends as cancelled, every flush asked is answered;
        nobody hangs."""
        for request, submit_tx in list(self._live.values()):
            submit_tx.close()
            deliver(request.sink, cancelled_event(request))
        self._live.clear()
        for done in self._policies.scheduler.abandon_flushes():
            done(None)


@asynccontextmanager
async def open_engine(model: Any = None, **config: Any) -> AsyncIterator[Engine]:
    """Open an engine over `model`: a GGUF path, a real model name, a Model, or None for the default."""
    cfg = EngineConfig(**config)
    # in a thread: loading (and hashing) a model file takes seconds, and a server that binds its port
    # first answers /health (503, loading) meanwhile (server.loading). Not abandoned on cancel: the
    # runtime comes back and is closed below.
    runtime, plan = await trio.to_thread.run_sync(_open_runtime, model, cfg)
    try:
        invariance = await _verify_invariance(runtime, cfg)
    except BaseException:
        runtime.close()
        raise
    async with _serve(runtime, cfg, plan, None) as engine:
        engine.invariance = invariance
        yield engine


async def _verify_invariance(runtime: ContextRuntime, cfg: EngineConfig) -> Any:
    """The model's batch-invariance verdict per cfg.verify_invariance (skippy.check.verify_at_open),
    in a thread: running the check takes seconds."""
    if cfg.verify_invariance == "off":
        return None
    from .check import verify_at_open

    return await trio.to_thread.run_sync(lambda: verify_at_open(runtime.model, runtime.ctx.options,
                                                                cfg.verify_invariance, invariant=cfg.batch_invariant))


@asynccontextmanager
async def open_engine_on(runtime: Runtime, lanes: LanePlan, *, pipeline: Any = None,
                         **config: Any) -> AsyncIterator[Engine]:
    """An engine over a Runtime that is already open (a pipeline's stage 0, skippy.testing's fake),
    with the lane plan its opener made. The engine closes the runtime on exit."""
    try:
        cfg = EngineConfig(**config)
    except BaseException:
        runtime.close()
        raise
    async with _serve(runtime, cfg, lanes, pipeline) as engine:
        yield engine


async def _probe(runtime: Runtime, engine: Engine) -> None:
    """Feed the step-cost model the runtime's probe (steps of known shape timed before serving), so the
    latency targets are derived from this machine at once; a runtime without one (a pipeline) derives them
    from its first steps."""
    scheduler = engine._policies.scheduler
    probe = getattr(runtime, "probe_step_costs", None)
    if scheduler.slo is None or probe is None:
        return
    # on the engine's own worker thread, where every later decode runs: a first decode from another thread
    # (trio's cache) left ggml's thread team of that thread competing with the worker's for seconds
    samples = await engine.worker.start(probe).result()
    if samples:
        scheduler.slo.calibrate(samples)
        scheduler.tell_targets()


@asynccontextmanager
async def _serve(runtime: Runtime, cfg: EngineConfig, plan: LanePlan, pipeline: Any) -> AsyncIterator[Engine]:
    engine = None
    try:
        engine = Engine(runtime, cfg, plan, pipeline)
        await _probe(runtime, engine)
        async with trio.open_nursery() as nursery:
            engine._start(nursery)
            try:
                yield engine
            finally:
                engine._closed = True
                runtime.abort()
                nursery.cancel_scope.cancel()
    finally:
        if engine is not None:
            engine._abandon()
            engine.worker.close()
        runtime.close()
