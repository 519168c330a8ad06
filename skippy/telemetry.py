"""Per-step telemetry, the step totals, and the engine's stats assembled when asked: plain data."""

from __future__ import annotations

from typing import Mapping

import attrs

from .kv import ComponentKind, Ledger


@attrs.frozen
class StepReport:
    """One step, as the composer saw it."""

    step: int
    running: int  # sequences in the running set when the step was composed
    waiting: int
    admitted: int
    preempted: int
    finished: int
    prefill_tokens: int
    decode_tokens: int
    kv_used: Mapping[ComponentKind, int]
    kv_free: Mapping[ComponentKind, int]
    t_compose: float  # seconds: admission + composition + batch arrays
    t_decode: float  # llama_decode in the worker thread
    t_sample: float  # sampling, detokenizing, routing and stop detection
    t_step: float  # wall time of the whole step, messaging included
    decode_ids: tuple[int, ...] = ()  # request ids that got a decode token
    prefill_ids: tuple[int, ...] = ()  # request ids that got a prefill chunk
    failed: int = 0

    @property
    def mixed(self) -> bool:
        return self.prefill_tokens > 0 and self.decode_tokens > 0


@attrs.frozen
class EngineStats:
    steps: int
    mixed_steps: int
    running: int
    waiting: int
    max_running: int
    submitted: int
    admitted: int
    preemptions: int
    rejected: int
    finished: Mapping[str, int]  # by finish reason
    prefill_tokens: int
    decode_tokens: int
    output_tokens: int
    kv_used: Mapping[ComponentKind, int]
    kv_free: Mapping[ComponentKind, int]
    t_compose: float
    t_decode: float
    t_sample: float
    t_step: float
    ceiling: int
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache (at admission)
    prefix_hits: int = 0  # prompt tokens shared from a resident entry or a running sequence
    prefix_evictions: int = 0  # resident entries evicted (budget, pressure, or subsumed)
    prefix_entries: int = 0
    prefix_resident_tokens: int = 0
    fork_shared_tokens: int = 0  # prompt tokens a choice of an n > 1 request shared from its first choice
    run_ahead_steps: int = 0  # steps routed on the worker thread, in runs (scheduling.run_ahead)
    kv_used_peak: Mapping[ComponentKind, int] = attrs.field(factory=dict)  # max over steps
    kv_bytes_per_cell: Mapping[ComponentKind, float] = attrs.field(factory=dict)  # per slot for RECURRENT
    t_busy: float = 0.0  # wall seconds between consecutive busy step starts
    t_busy_decode: float = 0.0  # of which inside the runtime's decode
    # latency targets (scheduling.slo): seconds (None: not resolved yet; ttft None: per request, derived)
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    slo_met: int = 0  # finished within both targets
    slo_missed: int = 0  # finished past one
    slo_shed: int = 0  # refused as late (shed_late)
    running_tokens: int = 0  # tokens in the cells of running sequences (what a router's load is: /get_load)

    @property
    def step_overhead_pct(self) -> float:
        """Share of busy wall time not spent in the decode: actor hops, the worker hand-off,
        composing, sampling, detokenizing, routing and event delivery, all of it."""
        return 100.0 * (self.t_busy - self.t_busy_decode) / self.t_busy if self.t_busy else 0.0


@attrs.define
class Totals:
    """What the steps add up to (the step scheduler's own record); everything that is a level
    (running, waiting, the ledger, the cache's size) is read from its owner when stats are asked."""

    steps: int = 0
    mixed_steps: int = 0
    max_running: int = 0
    finished: dict[str, int] = attrs.field(factory=lambda: {"stop": 0, "length": 0, "cancelled": 0, "error": 0})
    prefill_tokens: int = 0
    decode_tokens: int = 0
    output_tokens: int = 0
    t_compose: float = 0.0
    t_decode: float = 0.0
    t_sample: float = 0.0
    t_step: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefix_evictions: int = 0
    fork_shared_tokens: int = 0
    run_ahead_steps: int = 0
    kv_used_peak: dict = attrs.field(factory=dict)
    t_busy: float = 0.0  # wall time from each step's start to the next one's while the engine is busy
    t_busy_decode: float = 0.0  # of which inside the runtime's decode
    slo_met: int = 0  # finished within both latency targets (scheduling.slo)
    slo_missed: int = 0  # finished, but past a target

    def record(self, r: StepReport, output_tokens: int) -> None:
        self.steps += 1
        self.mixed_steps += r.mixed
        self.max_running = max(self.max_running, r.running)
        self.prefill_tokens += r.prefill_tokens
        self.decode_tokens += r.decode_tokens
        self.output_tokens += output_tokens
        self.t_compose += r.t_compose
        self.t_decode += r.t_decode
        self.t_sample += r.t_sample
        self.t_step += r.t_step
        for kind, used in r.kv_used.items():
            self.kv_used_peak[kind] = max(self.kv_used_peak.get(kind, 0), used)


def make_stats(totals: Totals, *, ceiling: int, running: int, waiting: int, ledger: Ledger | None,
               submitted: int, admitted: int, rejected: int, preemptions: int, cancelled_waiting: int,
               prefix_entries: int = 0, prefix_resident_tokens: int = 0, slo_ttft_s: float | None = None,
               slo_tpot_s: float | None = None, slo_shed: int = 0, running_tokens: int = 0) -> EngineStats:
    """EngineStats from the step totals and the levels as they are now (vLLM's make_stats())."""
    components = ledger.components if ledger else ()
    finished = dict(totals.finished)
    finished["cancelled"] = finished.get("cancelled", 0) + cancelled_waiting
    return EngineStats(
        steps=totals.steps, mixed_steps=totals.mixed_steps, running=running, waiting=waiting,
        max_running=totals.max_running, submitted=submitted, admitted=admitted, preemptions=preemptions,
        rejected=rejected, finished=finished, prefill_tokens=totals.prefill_tokens,
        decode_tokens=totals.decode_tokens, output_tokens=totals.output_tokens,
        kv_used={c.kind: c.used for c in components}, kv_free={c.kind: c.free for c in components},
        t_compose=totals.t_compose, t_decode=totals.t_decode, t_sample=totals.t_sample, t_step=totals.t_step,
        ceiling=ceiling, prefix_queries=totals.prefix_queries, prefix_hits=totals.prefix_hits,
        prefix_evictions=totals.prefix_evictions, prefix_entries=prefix_entries,
        prefix_resident_tokens=prefix_resident_tokens, fork_shared_tokens=totals.fork_shared_tokens,
        run_ahead_steps=totals.run_ahead_steps,
        kv_used_peak=dict(totals.kv_used_peak),
        kv_bytes_per_cell={c.kind: c.bytes / c.size for c in components if c.size},
        t_busy=totals.t_busy, t_busy_decode=totals.t_busy_decode,
        slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, slo_met=totals.slo_met, slo_missed=totals.slo_missed,
        slo_shed=slo_shed, running_tokens=running_tokens,
    )
