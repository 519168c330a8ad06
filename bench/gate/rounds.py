"""Repeated rounds of one load: engines interleaved round by round, then pooled into one run each.

A sequential row of ten N=1 requests drifts by about 10% on a 2-core box between one engine's
block and the next (the same code measured 1.04x and 1.13x of llama-server's TPOT in two sweeps).
Running each engine's block K times in alternating order (A B C, C B A, A B C, ...) spreads the
drift over every engine alike, and pooling the rounds keeps one row per engine for the gate. Pure.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from .records import RunResult


def round_order(engines: Sequence[str], k: int) -> list[str]:
    """Round k's engine order: forward on even rounds, reversed on odd ones (ABBA), so no engine
    always runs first after a load change or last before the next."""
    return list(engines) if k % 2 == 0 else list(reversed(engines))


def merge_rounds(rounds: Sequence[RunResult]) -> RunResult:
    """One run from K rounds of the same (engine, workload, load): requests pooled, durations added.

    Throughput over the pooled run is total output / total measured time, the mean over rounds
    weighted by their length. Send times and indices are offset so each request stays distinct
    and in order; each round's server readings stay under server["rounds"]."""
    if not rounds:
        raise ValueError("no rounds to merge")
    first = rounds[0]
    keys = {(r.engine, r.workload, r.load) for r in rounds}
    if len(keys) != 1:
        raise ValueError(f"rounds of different runs: {sorted(map(str, keys))}")
    if len(rounds) == 1:
        return first
    requests = []
    t_offset = 0.0
    i_offset = 0
    for run in rounds:
        for rec in run.requests:
            shift = t_offset if not rec.warmup else 0.0
            requests.append(attrs.evolve(rec, index=rec.index + i_offset, t_send=rec.t_send + shift))
        t_offset += run.duration
        i_offset += len(run.requests)
    rss = [r.server.get("peak_rss_mb") for r in rounds if r.server.get("peak_rss_mb") is not None]
    server = {**rounds[-1].server, "rounds": [dict(r.server, duration=r.duration) for r in rounds]}
    if rss:
        server["peak_rss_mb"] = max(rss)
    return RunResult(first.engine, first.workload, first.load, sum(r.duration for r in rounds), requests, server)
