"""Stress the engine in-process: N sessions per round through one `skippy.open_engine`.

    python -m stress.engine_run --sessions 256 --rounds 4 --seed 0 --family llama --out engine-n256

Each round: N clients arrive (a burst, then spread), each completing, cancelling (a cancelled
scope), disconnecting (aclose() or dropping the stream), timing out (a client deadline) or
sending something malformed, with random lengths, priorities and greedy or seeded sampling,
against a KV pool a quarter of the round's demand. Then the engine is drained and the
invariants are checked (stress/invariants.py); the process exits 1 if one fails.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any, Callable, Sequence

import attrs
import numpy as np
import trio
from tqdm import tqdm

import skippy
from skippy.errors import InvalidInputError, OverloadedError
from skippy.kv import ComponentKind

from . import invariants as inv
from . import report, tally
from .cli import RunConfig, as_dict, config_from, parser, vocab_range
from .outcomes import (
    CLIENT_CANCELLED,
    COMPLETED,
    ENDED_CANCELLED,
    FAILED,
    HUNG,
    OVERLOADED,
    REJECTED,
    TIMED_OUT,
    UNEXPECTED,
    Outcome,
)
from .proc_stats import rss_mib
from .reference import SoloReference
from .workload import Job, demand, engine_malformed, make_round, pool_cells, shared_prefixes


class _Round:
    """Per-round bookkeeping shared by the job tasks."""

    def __init__(self, jobs: Sequence[Job], bar: Any) -> None:
        self.jobs = jobs
        self.outcomes: list[Outcome] = []
        self.generated = 0  # generate() calls that returned a stream
        self.bar = bar

    def done(self, o: Outcome) -> None:
        self.outcomes.append(o)
        if self.bar is not None:
            self.bar.update(1)


def _record(o: Outcome, event: skippy.TokenEvent, t_start: float) -> None:
    if o.finals:
        o.final_last = False  # something after the final event
    if event.token is not None:
        o.tokens.append(event.token)
        o.indices.append(event.index)
        if o.ttft_s is None:
            o.ttft_s = time.perf_counter() - t_start
    o.text += event.text
    if event.final:
        o.finals += 1
        o.finish_reason = event.finish_reason
        o.completion_tokens = event.usage.completion_tokens if event.usage else None
        if event.finish_reason in ("stop", "length"):
            o.status = COMPLETED
        elif event.finish_reason == "error":
            o.status, o.detail = FAILED, repr(event.error)
        else:
            o.status, o.detail = ENDED_CANCELLED, "the engine ended it as cancelled"
        if event.token is None and event.index != len(o.tokens):
            o.indices.append(event.index)  # a token-less final event must carry the next index


async def _consume(stream: skippy.GenerationStream, job: Job, o: Outcome, t_start: float, rnd: _Round) -> None:
    """Read the stream as the job's client would; sets o.status unless a final event does."""
    rnd.generated += 1
    if job.kind == "cancel":
        with trio.CancelScope() as scope:
            if job.cut_after == 0:
                scope.cancel()  # before the first event: usually still waiting in the queue
            async for event in stream:
                _record(o, event, t_start)
                if len(o.tokens) >= job.cut_after and not event.final:
                    scope.cancel()
        if scope.cancelled_caught and not o.finals:
            o.status = CLIENT_CANCELLED
    elif job.kind == "disconnect":
        cut = False
        async for event in stream:
            _record(o, event, t_start)
            if len(o.tokens) >= job.cut_after and not event.final:
                cut = True
                break
        if cut:
            o.status = CLIENT_CANCELLED
            if job.drop:
                o.detail = "dropped"
                del stream  # the GenerationStream is garbage now: its __del__ cancels the request
            else:
                await stream.aclose()
    elif job.kind == "timeout":
        with trio.move_on_after(job.timeout_s) as scope:
            async for event in stream:
                _record(o, event, t_start)
        if scope.cancelled_caught and not o.finals:
            o.status = TIMED_OUT
    else:
        async for event in stream:
            _record(o, event, t_start)
        if not o.finals:
            o.status, o.detail = UNEXPECTED, "the stream ended without a final event"


async def _job(engine: skippy.Engine, job: Job, rnd: _Round, t0: float, n_vocab: int) -> None:
    o = Outcome(job.id, job.kind, max_tokens=job.max_tokens, priority=job.priority, greedy=job.greedy)
    try:
        await trio.sleep_until(t0 + job.arrival_s)
        t_start = time.perf_counter()
        if job.kind == "malformed":
            args, kwargs = engine_malformed(job, engine.n_ctx, n_vocab)
            try:
                stream = engine.generate(*args, **kwargs)
            except InvalidInputError as exc:
                o.status, o.detail = REJECTED, f"{type(exc).__name__}: {exc}"
            else:
                stream.cancel()
                o.status, o.detail = UNEXPECTED, f"malformed input ({job.malformed}) was accepted"
        else:
            try:
                # no reference kept here: a "drop" disconnect leaves the stream to the garbage collector
                await _consume(engine.generate(list(job.prompt), job.sampling, max_tokens=job.max_tokens,
                                               priority=job.priority), job, o, t_start, rnd)
            except OverloadedError as exc:
                o.status, o.detail = OVERLOADED, str(exc)
    except trio.Cancelled:
        o.status, o.detail = HUNG, "still open at the round deadline"
        rnd.done(o)
        raise
    except Exception as exc:  # any other exception is a finding, never a crash of the run
        o.status, o.detail = UNEXPECTED, f"{type(exc).__name__}: {exc}"
    rnd.done(o)


def _lanes_holding(engine: skippy.Engine) -> tuple[int, ...] | None:
    ctx = getattr(engine.runtime, "ctx", None)
    if ctx is None:
        return None
    return tuple(s for s in range(engine.lanes.ceiling) if ctx.seq_pos_max(s) != -1)


def _snapshot(engine: skippy.Engine) -> inv.MemorySnapshot:
    s = engine.stats()
    attn = engine.runtime.ledger().get(ComponentKind.ATTN)
    return inv.MemorySnapshot(running=s.running, waiting=s.waiting, attn_used=attn.used if attn else 0,
                              prefix_resident=s.prefix_resident_tokens, lanes_holding=_lanes_holding(engine),
                              live_requests=engine.live)


async def _drain(engine: skippy.Engine, base: skippy.EngineStats, timeout: float) -> inv.MemorySnapshot:
    """Wait until the scheduler is quiet (nothing running or waiting, every submitted request
    finished), then until memory is idle; the snapshot at the timeout shows what stuck."""
    with trio.move_on_after(timeout):
        while True:
            s = engine.stats()
            finished = sum(s.finished.values()) - sum(base.finished.values())
            if s.running == 0 and s.waiting == 0 and finished >= s.submitted - base.submitted:
                break
            await trio.sleep(0.01)
        # quiet: no step is computing, so the context may be read from this thread
        while not inv.memory_idle(_snapshot(engine)).ok:
            await trio.sleep(0.02)
    return _snapshot(engine)


def _parity(ref: SoloReference, outcomes: Sequence[Outcome], jobs: Sequence[Job], k: int,
            rng: np.random.Generator) -> list[inv.ParitySample]:
    by_id = {j.id: j for j in jobs}
    return [inv.ParitySample(o.job_id, tuple(o.tokens), tuple(ref.tokens(by_id[o.job_id].prompt, o.max_tokens)))
            for o in tally.greedy_sample(outcomes, k, rng)]


def _delta(now: dict, base: dict) -> dict[str, int]:
    return {k: now.get(k, 0) - base.get(k, 0) for k in now}


async def run(cfg: RunConfig, *, progress: bool | None = None,
              on_engine: Callable[[skippy.Engine], None] | None = None) -> dict[str, Any]:
    """One stress run; returns the summary (also written under stress/results/ when cfg.out).

    `on_engine` sees the engine once it is open: tests inject faults through it (e.g. wrap
    `engine.runtime.decode`) to prove the checks catch what they claim to."""
    from skippy.native import ensure_built

    ensure_built(progress=False)
    path = cfg.model_path()
    solo_ctx = int(np.ceil((cfg.prompt[1] + 32 + cfg.max_tokens[1]) / 64) * 64)
    started = time.perf_counter()
    checks: list[inv.Check] = []
    round_rows: list[dict[str, Any]] = []
    rss: list[float] = []
    all_samples: list[inv.ParitySample] = []
    with SoloReference(path, solo_ctx, cfg.threads) as ref:
        shape = cfg.shape(vocab_range(cfg, ref.n_vocab), server=False)
        prefixes = shared_prefixes(shape, cfg.seed)
        rounds = [make_round(shape, cfg.sessions, cfg.seed, r, prefixes) for r in range(cfg.rounds)]
        n_ctx = pool_cells(rounds, cfg.demand_ratio)
        extra = {} if cfg.decode_reserve is None else {"decode_reserve": cfg.decode_reserve}
        async with skippy.open_engine(path, n_ctx=n_ctx, n_batch=cfg.n_batch, n_seq_max=cfg.n_seq_max,
                                      threads=cfg.threads, max_waiting=cfg.waiting_bound, **extra) as engine:
            pool = engine.n_ctx
            if on_engine is not None:
                on_engine(engine)
            for r, jobs in enumerate(rounds):
                base = engine.stats()
                show = (not cfg.quiet) if progress is None else progress
                bar = tqdm(total=len(jobs), desc=f"engine round {r + 1}/{cfg.rounds}", file=sys.stderr,
                           leave=False) if show else None
                rnd = _Round(jobs, bar)
                t0 = trio.current_time()
                with trio.move_on_after(cfg.round_timeout):
                    async with trio.open_nursery() as nursery:
                        for job in jobs:
                            nursery.start_soon(_job, engine, job, rnd, t0, ref.n_vocab)
                seconds = trio.current_time() - t0
                if bar is not None:
                    bar.close()
                snap = await _drain(engine, base, cfg.drain_timeout)
                gc.collect()
                rss.append(rss_mib())
                s = engine.stats()
                rejected = s.rejected - base.rejected
                finished = _delta(s.finished, base.finished)
                samples = _parity(ref, rnd.outcomes, jobs, cfg.parity_sample, np.random.default_rng([cfg.seed, r, 7]))
                all_samples += samples
                round_checks = [
                    inv.one_outcome_per_request(jobs, rnd.outcomes),
                    inv.no_decode_failure(rnd.outcomes),
                    inv.clear_outcomes(jobs, rnd.outcomes),
                    inv.engine_streams_well_formed(rnd.outcomes),
                    inv.engine_accounting(rnd.generated - rejected, s.submitted - base.submitted, finished),
                    inv.memory_idle(snap),
                    inv.solo_parity(samples),
                ]
                checks += tally.per_round(r + 1, round_checks)
                round_rows.append({
                    "round": r + 1, "seconds": seconds, "rss_mib": rss[-1],
                    "outcomes": tally.statuses(rnd.outcomes),
                    "demand_cells": demand(jobs), "pool_cells": pool,
                    "steps": s.steps - base.steps, "preemptions": s.preemptions - base.preemptions,
                    "kv_peak": dict((k.name.lower(), v) for k, v in s.kv_used_peak.items()),
                    "max_running": s.max_running, "output_tokens": s.output_tokens - base.output_tokens,
                    "prefix_hits": s.prefix_hits - base.prefix_hits, "finished": finished,
                    "ttft_by_priority_s": tally.ttft_by_priority(rnd.outcomes),
                    "memory": attrs.asdict(snap),
                    "failures": [o.summary() for o in tally.not_fine(rnd.outcomes, jobs)],
                })
                if not cfg.quiet:
                    print(f"round {r + 1}: {seconds:.1f}s {tally.statuses(rnd.outcomes)} "
                          f"rss={rss[-1]:.1f}MiB", file=sys.stderr, flush=True)
            final = engine.stats()
            lanes, ceiling = engine.lanes, engine.lanes.ceiling
    final_checks = tally.roll_up(checks) + [
        inv.rss_stable(rss, cfg.rss_tolerance_mib, cfg.rss_tolerance_pct),
        inv.solo_parity(all_samples),
    ]
    mean_demand = sum(demand(j) for j in rounds) / len(rounds)
    totals = {
        "requests": cfg.sessions * cfg.rounds, "seconds": round(time.perf_counter() - started, 1),
        "pool_cells": pool, "mean_demand_cells": round(mean_demand), "demand_over_pool": round(mean_demand / pool, 2),
        "lane_ceiling": ceiling, "lane_reason": lanes.reason, "steps": final.steps,
        "preemptions": final.preemptions, "max_running": final.max_running, "output_tokens": final.output_tokens,
        "prefix_hits": final.prefix_hits, "prefix_evictions": final.prefix_evictions,
        "kv_peak": {k.name.lower(): v for k, v in final.kv_used_peak.items()},
        "finished": dict(final.finished), "rss_mib": [round(x, 1) for x in rss],
        "parity_compared": len(all_samples),
    }
    result = report.summary("engine", cfg.command or "stress.engine_run", {**as_dict(cfg), "model_path": str(path)},
                            final_checks + checks, round_rows, totals)
    if cfg.out:
        result["written_to"] = str(report.write(result, cfg.out))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parser("stress.engine_run", __doc__.splitlines()[0]).parse_args(argv)
    cfg = config_from(args, argv, "stress.engine_run")
    result = trio.run(run, cfg)
    return report.finish(result)


if __name__ == "__main__":
    sys.exit(main())
