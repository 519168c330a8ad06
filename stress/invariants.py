"""The invariants of a stress run, as pure functions over what the drivers recorded.

Every check returns a Check (name, ok, detail); none does I/O, so each is unit-tested on
hand-made records (tests/stress/test_invariants.py) and the drivers only gather evidence.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

import attrs

from .outcomes import ALLOWED, COMPLETED, FAILED, REJECTED, Outcome
from .workload import Job


@attrs.frozen
class Check:
    name: str
    ok: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def _some(items: Iterable[object], n: int = 5) -> str:
    items = list(items)
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(str(i) for i in items[:n]) + more


# -- requests ---------------------------------------------------------------------------


def one_outcome_per_request(jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> Check:
    """None lost (a job without an outcome, or one that hung), none duplicated, none invented."""
    want = Counter(j.id for j in jobs)
    got = Counter(o.job_id for o in outcomes)
    missing = sorted(set(want) - set(got))
    dup = sorted(k for k, n in got.items() if n > 1)
    unknown = sorted(set(got) - set(want))
    hung = sorted(o.job_id for o in outcomes if o.status == "hung")
    ok = not (missing or dup or unknown or hung)
    detail = f"{len(jobs)} requests, {len(outcomes)} outcomes"
    if not ok:
        detail += f"; missing {_some(missing)}; duplicated {_some(dup)}; unknown {_some(unknown)}; hung {_some(hung)}"
    return Check("every request has exactly one outcome", ok, detail)


def no_decode_failure(outcomes: Sequence[Outcome]) -> Check:
    """No client saw finish_reason "error", an HTTP 5xx or an error chunk."""
    bad = [o for o in outcomes if o.status == FAILED or o.finish_reason == "error"
           or (o.http_status is not None and o.http_status >= 500)]
    return Check("no decode failure reached a client", not bad,
                 f"{len(bad)} failed" + (f": {_some(f'{o.job_id} ({o.detail})' for o in bad)}" if bad else ""))


def clear_outcomes(jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> Check:
    """Each request ended in a way its client can act on: a completion or a clear error."""
    kinds = {j.id: j.kind for j in jobs}
    bad = [o for o in outcomes if o.status not in ALLOWED.get(kinds.get(o.job_id, ""), ())]
    bad += [o for o in outcomes if o.status == REJECTED and (
        o.error_body_ok is False or (o.expected_status is not None and o.http_status != o.expected_status))]
    counts = Counter(o.status for o in outcomes)
    detail = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    if bad:
        detail += f"; unclear: {_some(f'{o.job_id} [{o.kind}] {o.status} {o.detail}'.strip() for o in bad)}"
    return Check("every request got a completion or a clear error", not bad, detail)


def _stream_problems(o: Outcome) -> list[str]:
    """What is wrong with one engine event stream."""
    problems = []
    if o.indices != list(range(len(o.indices))):
        problems.append(f"indices not contiguous from 0: {o.indices[:8]}...")
    if o.finals > 1:
        problems.append(f"{o.finals} final events")
    if o.finals and not o.final_last:
        problems.append("an event after the final one")
    if o.status == COMPLETED:
        if o.finals != 1:
            problems.append("completed without exactly one final event")
        if o.completion_tokens is not None and o.completion_tokens != len(o.tokens):
            problems.append(f"usage says {o.completion_tokens} tokens, {len(o.tokens)} seen")
        if len(o.tokens) > o.max_tokens:
            problems.append(f"{len(o.tokens)} tokens > max_tokens {o.max_tokens}")
        if o.finish_reason == "length" and len(o.tokens) != o.max_tokens:
            problems.append(f"length after {len(o.tokens)} of {o.max_tokens} tokens")
    return problems


def engine_streams_well_formed(outcomes: Sequence[Outcome]) -> Check:
    """Token indices contiguous from 0; exactly one final event, last; usage agrees with the tokens."""
    bad = {o.job_id: p for o in outcomes if (p := _stream_problems(o))}
    n = sum(1 for o in outcomes if o.indices or o.finals)
    return Check("event streams well formed (contiguous indices, one final event)", not bad,
                 f"{n} streams" + (f"; {_some(f'{k}: {v}' for k, v in bad.items())}" if bad else ""))


def _sse_problems(o: Outcome) -> list[str]:
    problems = []
    if o.status == COMPLETED:
        if o.finals != 1:
            problems.append(f"{o.finals} finish chunks")
        if not o.final_last:
            problems.append("content after the finish chunk")
        if o.completion_tokens is None:
            problems.append("no usage")
        elif o.completion_tokens > o.max_tokens:
            problems.append(f"{o.completion_tokens} tokens > max_tokens {o.max_tokens}")
        elif o.finish_reason == "length" and o.completion_tokens != o.max_tokens:
            problems.append(f"length after {o.completion_tokens} of {o.max_tokens} tokens")
        if o.completion_tokens is not None and o.chunks > o.completion_tokens:
            problems.append(f"{o.chunks} content chunks for {o.completion_tokens} tokens")
        if o.done > 1 or o.after_done:
            problems.append(f"{o.done} [DONE], {o.after_done} lines after it")
        if len(set(o.response_ids)) > 1:
            problems.append(f"{len(set(o.response_ids))} response ids")
    elif o.finals > 1:
        problems.append(f"{o.finals} finish chunks")
    return problems


def server_responses_well_formed(outcomes: Sequence[Outcome]) -> Check:
    """One finish chunk, one [DONE] and nothing after it, one response id, usage within max_tokens;
    response ids unique across the run (no response delivered twice)."""
    bad = {o.job_id: p for o in outcomes if (p := _sse_problems(o))}
    owners: dict[str, set[str]] = {}
    for o in outcomes:
        for rid in set(o.response_ids):
            owners.setdefault(rid, set()).add(o.job_id)
    shared = {rid: sorted(js) for rid, js in owners.items() if len(js) > 1}
    ok = not bad and not shared
    detail = f"{sum(1 for o in outcomes if o.status == COMPLETED)} completions, {len(owners)} response ids"
    if bad:
        detail += f"; {_some(f'{k}: {v}' for k, v in bad.items())}"
    if shared:
        detail += f"; ids shared by several requests: {_some(shared.items())}"
    return Check("responses well formed (one finish, one [DONE], unique ids)", ok, detail)


# -- engine accounting --------------------------------------------------------------------


def engine_accounting(accepted: int, submitted: int, finished: Mapping[str, int]) -> Check:
    """Engine counters over a round: every request the engine took was finished exactly once."""
    total = sum(finished.values())
    ok = submitted == accepted and total == submitted and finished.get("error", 0) == 0
    return Check("engine finished every accepted request once", ok,
                 f"accepted {accepted}, submitted {submitted}, finished {total} {dict(finished)}")


def server_accounting(completed: int, cut: int, well_formed: int, finished: Mapping[str, int]) -> Check:
    """/metrics over a round: the server finished no request twice and none in error.

    `completed` clients saw a completion and `cut` hung up (cancel, disconnect, timeout), so
    stop + length is at least `completed` and at most `completed + cut` (a cut request may have
    finished just before its client left), and nothing finished beyond the well-formed requests."""
    done = finished.get("stop", 0) + finished.get("length", 0)
    total = sum(finished.values())
    ok = completed <= done <= completed + cut and total <= well_formed and finished.get("error", 0) == 0
    return Check("server finished every request at most once, none in error", ok,
                 f"clients: {completed} completed, {cut} cut, {well_formed} well formed; server finished {dict(finished)}")


# -- memory -------------------------------------------------------------------------------


@attrs.frozen
class MemorySnapshot:
    """The engine once every client is done and the scheduler is quiet."""

    running: int
    waiting: int
    attn_used: int
    prefix_resident: int
    lanes_holding: tuple[int, ...] | None = None  # lane seq ids (< ceiling) with cells; None: not visible
    live_requests: int | None = None  # the engine's per-request records still held


def memory_idle(snap: MemorySnapshot) -> Check:
    """Back to idle: nothing running or waiting, no lane holds a cell, and the attention cells in
    use are at most what the prefix cache keeps resident (its entries live on reserved seq ids)."""
    problems = []
    if snap.running or snap.waiting:
        problems.append(f"running={snap.running} waiting={snap.waiting}")
    if snap.lanes_holding:
        problems.append(f"lane seq ids still holding cells: {_some(snap.lanes_holding)}")
    if snap.attn_used > snap.prefix_resident:
        problems.append(f"attn used {snap.attn_used} > prefix resident {snap.prefix_resident}")
    if snap.live_requests:
        problems.append(f"{snap.live_requests} request records still live")
    detail = (f"running={snap.running} waiting={snap.waiting} attn_used={snap.attn_used} "
              f"prefix_resident={snap.prefix_resident}")
    if snap.lanes_holding is not None:
        detail += f" lanes_holding={len(snap.lanes_holding)}"
    if problems:
        detail += "; " + "; ".join(problems)
    return Check("KV memory back to idle after drain", not problems, detail)


def rss_stable(rss_mib: Sequence[float], tolerance_mib: float, tolerance_pct: float) -> Check:
    """RSS after the last round within tolerance of RSS after round 2 (round 1 warms caches up)."""
    if len(rss_mib) < 3:
        return Check("RSS not growing across rounds", True,
                     f"not measured: needs >= 3 rounds, got {len(rss_mib)} ({_some(f'{r:.1f}' for r in rss_mib)} MiB)")
    base, last = rss_mib[1], rss_mib[-1]
    allowed = max(tolerance_mib, base * tolerance_pct / 100)
    growth = last - base
    return Check("RSS not growing across rounds", growth <= allowed,
                 f"round 2 {base:.1f} MiB -> round {len(rss_mib)} {last:.1f} MiB ({growth:+.1f} MiB, "
                 f"allowed +{allowed:.1f}); per round: {', '.join(f'{r:.1f}' for r in rss_mib)}")


def connections_released(baseline: int, after: int, slack: int = 8) -> Check:
    """Once every client of a round has closed its connection, the server holds no more file
    descriptors than before the round (a connection kept after its client left is a socket in
    CLOSE-WAIT, with its fd and task)."""
    return Check("server released the connections its clients closed", 0 <= after <= baseline + slack,
                 f"open fds: {baseline} before the rounds, {after} after this one (slack {slack})")


# -- parity ---------------------------------------------------------------------------------


@attrs.frozen
class ParitySample:
    job_id: str
    got: tuple  # tokens (engine) or (text, completion_tokens) (server)
    want: tuple


def solo_parity(samples: Sequence[ParitySample]) -> Check:
    """Completed greedy requests equal their solo greedy output (batch invariance, end to end)."""
    bad = [s for s in samples if s.got != s.want]
    ok = bool(samples) and not bad
    detail = f"{len(samples) - len(bad)}/{len(samples)} sampled greedy completions equal their solo run"
    if not samples:
        detail += " (no sample: nothing to compare)"
    if bad:
        detail += f"; differ: {_some(s.job_id for s in bad)}"
    return Check("sampled greedy completions equal solo greedy output", ok, detail)


def all_ok(checks: Sequence[Check]) -> bool:
    return all(c.ok for c in checks)
