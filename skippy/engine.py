"""The embedded API: `async with open_engine(model, **config) as engine:` then `engine.generate(...)`.

The engine's actors live in a nursery opened inside the caller's task tree, so they
cannot outlive it; the one worker thread is joined and the context closed on exit.
"""

from __future__ import annotations

import itertools
import math
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import attrs
import numpy as np
import trio
from loguru import logger

from ._plan import context_base, pool_cells
from .actors._mail import deliver, poke
from .actors.admission import AdmissionActor
from .actors.composer import ComposerActor
from .actors.messages import Cancel, Submit, Wake
from .actors.preemption import PreemptionActor
from .actors.runtime_owner import RuntimeOwner
from .actors.worker import Worker
from .errors import EngineClosedError, InvalidInputError
from .kv import ComponentKind
from .runtime import ContextRuntime, Runtime
from .sampling import SamplingParams
from .scheduling.admission import Admission, fcfs_priority
from .scheduling.composer import Composer
from .scheduling.lanes import LanePlan, plan_lanes
from .scheduling.preemption import Preemption, VictimOrder
from .scheduling.prefix import PrefixCache
from .scheduling.requests import Request, TokenEvent, validate
from .telemetry import Counters, EngineStats, StepReport


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
    # the default kernels, prefill slower (one-row attention instead of the tiled kernel, and
    # no repacked weights); see the issue note for the figures.
    batch_invariant: bool = True
    on_step: Callable[[StepReport], None] | None = None


def _open_runtime(model: Any, cfg: EngineConfig) -> tuple[Runtime, LanePlan]:
    """A Runtime for `model` (path, name, Model, or a Runtime itself) and its lane plan."""
    from .families import KvClass
    from .native import ContextOptions, Model

    if model is None or isinstance(model, (str, os.PathLike)):
        from .models import resolve_model
        from .native import ensure_built

        ensure_built(progress=False)
        # repacked weights use kernels that are not batch-invariant, so invariant engines load without them
        m, own = Model(resolve_model(model), repack=not cfg.batch_invariant), True
    elif isinstance(model, Model):
        m, own = model, False
        if cfg.batch_invariant and m.repack:
            logger.warning("{} was loaded with repacked weights, whose kernels are not batch-invariant: "
                           "load it with Model(path, repack=False) for exact-output parity", m.path.name)
    else:  # a Runtime already (tests: FakeRuntime)
        reserved = _reserved(cfg) if getattr(model, "prefix_identity", None) is not None else 0
        requested = min(model.n_seq_max - reserved, cfg.n_seq_max or 256)
        plan = plan_lanes(KvClass.DENSE, model.n_ctx, model.n_batch, requested=requested, reserved=reserved,
                          floor_ctx_per_session=1, prefix_fraction=_prefix_fraction(cfg, model.n_ctx))
        return model, plan
    try:
        base = context_base(cfg.n_batch, cfg.threads, cfg.batch_invariant)
        base.update(cfg.context_options)
        if not base.get("kv_unified", True):
            raise InvalidInputError("the scheduler needs unified KV (one shared cell pool); kv_unified=False is not supported")
        plan = plan_engine(m, cfg, base, measure=False)
        base["n_ctx"] = plan.n_ctx
        runtime = ContextRuntime(m, ContextOptions(**{**base, "n_seq_max": plan.n_seq_max}), own_model=own)
    except BaseException:
        if own:
            m.close()
        raise
    logger.info("engine: {} n_ctx={} n_batch={} ceiling={} ({})", m.arch, runtime.n_ctx, runtime.n_batch,
                plan.ceiling, plan.reason)
    return runtime, plan


def plan_engine(model: Any, cfg: EngineConfig, options: Mapping[str, Any], *, measure: bool = True) -> LanePlan:
    """The lane plan of `cfg` over a loaded Model: what open_engine uses and `skippy plan` prints."""
    from ._plan import plan_for

    n_ctx = pool_cells(cfg.n_ctx, cfg.memory_bytes)
    return plan_for(model, options, n_ctx=n_ctx, requested=cfg.n_seq_max, reserved=_reserved(cfg),
                    floor_ctx_per_session=cfg.floor_ctx_per_session, memory_bytes=cfg.memory_bytes,
                    prefix_fraction=_prefix_fraction(cfg, n_ctx), measure=measure)


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

    async def __anext__(self) -> TokenEvent:
        try:
            await self._await_submission()
            if self._done:
                raise StopAsyncIteration
            try:
                event = await self._events.receive()
            except trio.EndOfChannel:
                self._done = True
                raise StopAsyncIteration from None
        except trio.Cancelled:
            self.cancel()
            raise
        if event.final:
            self._done = True
            self._engine._forget(self.request)
        return event

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


class Engine:
    def __init__(self, runtime: Runtime, cfg: EngineConfig, plan: LanePlan) -> None:
        self.runtime = runtime
        self.config = cfg
        self.lanes = plan
        self.counters = Counters(ceiling=plan.ceiling)
        self._ids = itertools.count()
        self._live: dict[int, tuple[Request, trio.MemorySendChannel]] = {}
        self._closed = False
        self._runtime_tx, runtime_rx = trio.open_memory_channel(math.inf)
        self._admission_tx, admission_rx = trio.open_memory_channel(math.inf)
        self._composer_tx, composer_rx = trio.open_memory_channel(math.inf)
        self._preemption_tx, preemption_rx = trio.open_memory_channel(math.inf)
        self.worker = Worker()
        self._owner = RuntimeOwner(runtime, self.worker, runtime_rx)
        self._admission = AdmissionActor(
            Admission(plan.ceiling, cfg.max_waiting, cfg.decode_reserve, cfg.priority_key),
            admission_rx, self._composer_tx, self.counters)
        self._preemption = PreemptionActor(
            Preemption(cfg.victim_policy, cfg.max_preemptions), preemption_rx, self._runtime_tx,
            self._admission_tx, self.counters)
        self._composer = ComposerActor(
            Composer(runtime.n_batch), composer_rx, self._runtime_tx, self._admission_tx, self._preemption_tx,
            runtime.ledger(), self.counters, cfg.decode_reserve, cfg.on_step, _prefix_cache(runtime, cfg, plan))
        self.counters.ledger = runtime.ledger()

    def _start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._owner.run, name="skippy.runtime_owner")
        nursery.start_soon(self._admission.run, name="skippy.admission")
        nursery.start_soon(self._preemption.run, name="skippy.preemption")
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
    ) -> GenerationStream:
        """Queue a generation now; iterate the result for its TokenEvents.

        Bad input raises here (named InvalidInputError subclasses); a full queue raises
        OverloadedError from the first iteration (or from `await stream.queued()`).
        `ignore_eos=True` keeps generating past end-of-generation tokens (benchmarks).
        """
        if self._closed:
            raise EngineClosedError("the engine is closed")
        if isinstance(sampling, Mapping):
            sampling = SamplingParams(**sampling)
        sampling = sampling or SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise InvalidInputError(f"sampling must be SamplingParams or a dict, got {type(sampling).__name__}")
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        if not all(isinstance(s, str) for s in stops):
            raise InvalidInputError("stop must be a string or a sequence of strings")
        if not isinstance(priority, int):
            raise InvalidInputError(f"priority must be an integer, got {priority!r}")
        tokens = self.runtime.tokenize(prompt) if isinstance(prompt, str) else prompt
        tokens = validate(tokens, max_tokens, self.runtime.n_ctx, self.runtime.n_vocab)
        rid = next(self._ids)
        request = Request(rid, tokens, int(max_tokens), sampling, priority, stops, arrival=rid,
                          ignore_eos=bool(ignore_eos))
        events_tx, events_rx = trio.open_memory_channel(math.inf)
        request.sink = events_tx
        submit_tx, submit_rx = trio.open_memory_channel(1)
        self._live[rid] = (request, submit_tx)
        poke(self._admission_tx, Submit(request, submit_tx))
        return GenerationStream(self, request, events_rx, submit_rx)

    def stats(self) -> EngineStats:
        return self.counters.snapshot()

    # -- internals --------------------------------------------------------------------

    def _cancel(self, request: Request) -> None:
        request.cancel_requested = True
        self._forget(request)
        poke(self._admission_tx, Cancel(request))
        poke(self._composer_tx, Wake())

    def _forget(self, request: Request) -> None:
        self._live.pop(request.id, None)

    def _abandon(self) -> None:
        """After the actors are gone: every live request ends as cancelled; nobody hangs."""
        for request, submit_tx in list(self._live.values()):
            submit_tx.close()
            deliver(request.sink, TokenEvent(None, "", len(request.generated), "cancelled", request.usage))
        self._live.clear()


@asynccontextmanager
async def open_engine(model: Any = None, **config: Any) -> AsyncIterator[Engine]:
    """Open an engine over `model`: a GGUF path, a real model name, a Model, or None for the default."""
    cfg = EngineConfig(**config)
    runtime, plan = _open_runtime(model, cfg)
    engine = None
    try:
        engine = Engine(runtime, cfg, plan)
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
