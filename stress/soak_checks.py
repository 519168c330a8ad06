"""The soak's records and pass criteria, as pure functions (no I/O, no trio).

A soak passes when, over a bounded run of steady open-loop load: every request ended exactly
once and clearly (the request checks of `invariants`, over the whole run); after the warm-up
the server's RSS, open fds and threads did not grow beyond noise (the median of the last
quarter against the first's); the KV cells went back to the prefix cache's once idle at the
end; and the p99 latency of the last window stayed within a factor (plus an absolute slack) of
the first steady window's. A criterion without enough evidence to judge fails: a soak too short
to see anything must not pass. tests/stress/test_soak.py feeds each one what it must catch.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Mapping, Sequence

import attrs
import numpy as np

from . import invariants as inv
from .invariants import Check
from .outcomes import CLIENT_CANCELLED, COMPLETED, OVERLOADED, REJECTED, TIMED_OUT, Outcome
from .workload import Job


@attrs.frozen
class Sample:
    """The server every few seconds: its process (/proc), its engine (/metrics), the clients."""

    t: float  # seconds since the load started (negative: before it; past its end: the idle tail)
    rss_mib: float
    fds: int
    threads: int
    kv_used: int = -1  # attention cells in use (-1: /metrics did not answer)
    prefix_resident: int = -1  # tokens the prefix cache keeps resident
    running: int = -1
    waiting: int = -1
    in_flight: int = 0  # requests the clients hold open
    ended: int = 0  # requests ended so far
    cpu_s: float = float("nan")  # the server's CPU seconds so far (its share per period: is it starved?)
    load1: float = float("nan")  # the machine's load average (what else competed for the CPUs)


@attrs.frozen
class Finish:
    """One request's end, for the latency windows; latencies count from its scheduled arrival, so
    a client that falls behind shows as latency (open loop: no coordinated omission)."""

    t: float  # when it ended, seconds since the load started
    status: str
    lag_s: float = 0.0  # how late its client started it after its scheduled arrival
    ttft_s: float | None = None  # to the first token (streamed completions only)
    total_s: float | None = None  # to the end of the response (completions only)


@attrs.frozen
class Window:
    """Latency of the completions that ended in [t0, t1)."""

    t0: float
    t1: float
    n: int
    ttft_p50: float | None
    ttft_p99: float | None
    total_p50: float | None
    total_p99: float | None
    lag_max: float | None


@attrs.frozen
class Tolerances:
    """What counts as noise. Growth is judged after the warm-up, median of the last quarter minus
    the first's; latency as last p99 <= factor * first p99 + slack."""

    rss_mib: float = 8.0
    rss_pct: float = 5.0
    fds: int = 16  # open connections come and go with the load
    threads: int = 4
    p99_factor: float = 1.5
    p99_slack_s: float = 0.1
    min_window: int = 20  # completions a latency window needs to be judged
    min_samples: int = 8  # samples after the warm-up a growth check needs


# -- latency --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def window(finishes: Sequence[Finish], t0: float, t1: float) -> Window:
    """The latency percentiles of the completions that ended in [t0, t1)."""
    done = [f for f in finishes if t0 <= f.t < t1 and f.status == COMPLETED]
    ttft = [f.ttft_s for f in done if f.ttft_s is not None]
    total = [f.total_s for f in done if f.total_s is not None]
    lags = [f.lag_s for f in finishes if t0 <= f.t < t1]
    return Window(t0, t1, len(done), percentile(ttft, 50), percentile(ttft, 99), percentile(total, 50),
                  percentile(total, 99), max(lags) if lags else None)


def windows(finishes: Sequence[Finish], edges: Sequence[float]) -> list[Window]:
    """One Window per pair of consecutive edges (finishes sorted by t: each window a slice)."""
    ordered = sorted(finishes, key=lambda f: f.t)
    times = [f.t for f in ordered]
    out = []
    for t0, t1 in zip(edges, edges[1:]):
        lo, hi = np.searchsorted(times, t0, "left"), np.searchsorted(times, t1, "left")
        out.append(window(ordered[lo:hi], t0, t1))
    return out


def steady_edges(warmup_s: float, load_s: float, width: float) -> list[float]:
    """Edges of the full latency windows after the warm-up, the last one ending with the load (the
    first starts at the warm-up's end or a little after)."""
    n = math.floor((load_s - warmup_s) / width + 1e-9) if width > 0 else 0
    start = load_s - n * width
    return [start + k * width for k in range(n + 1)] if n >= 1 else []


def _p99_check(name: str, key: Callable[[Window], float | None], ws: Sequence[Window], tol: Tolerances) -> Check:
    if len(ws) < 2:
        return Check(name, False, f"cannot judge: {len(ws)} steady window(s), needs 2 (a longer run, narrower windows)")
    first, last = ws[0], ws[-1]
    a, b = key(first), key(last)
    if first.n < tol.min_window or last.n < tol.min_window:
        return Check(name, False, f"cannot judge: {first.n} and {last.n} completions in the first and last window, "
                                  f"needs {tol.min_window} each")
    if a is None or b is None:
        return Check(name, False, "cannot judge: no value in the first or the last window (no streamed completion)")
    allowed = tol.p99_factor * a + tol.p99_slack_s
    every = ", ".join("-" if key(w) is None else f"{key(w):.3f}" for w in ws)
    return Check(name, b <= allowed,
                 f"{a:.3f} s in [{first.t0:.0f}, {first.t1:.0f}) s -> {b:.3f} s in [{last.t0:.0f}, {last.t1:.0f}) s "
                 f"(allowed <= {allowed:.3f} = {tol.p99_factor:g} x first + {tol.p99_slack_s:g}); "
                 f"every window: {every}")


def latency_stable(ws: Sequence[Window], tol: Tolerances) -> list[Check]:
    """The last window's p99 (to the first token; to the end) within tolerance of the first steady one's."""
    return [
        _p99_check("p99 time to first token stable (last window vs first steady)", lambda w: w.ttft_p99, ws, tol),
        _p99_check("p99 request latency stable (last window vs first steady)", lambda w: w.total_p99, ws, tol),
    ]


# -- growth ---------------------------------------------------------------------------------


def slope_per_min(times: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope, per minute (0 with fewer than two distinct times)."""
    if len(times) < 2 or max(times) == min(times):
        return 0.0
    return float(np.polyfit(np.asarray(times, float), np.asarray(values, float), 1)[0] * 60)


def growth(name: str, unit: str, times: Sequence[float], values: Sequence[float], warmup_s: float, load_s: float,
           allowed_abs: float, allowed_pct: float = 0.0, min_samples: int = 8) -> Check:
    """After the warm-up and while the load lasts: the median of the last quarter at most the
    first quarter's plus max(allowed_abs, allowed_pct % of it). Medians, not ends: a sample caught
    mid-burst is noise; a leak moves the whole quarter. Unreadable samples (nan, -1) do not count."""
    pts = [(t, float(v)) for t, v in zip(times, values) if warmup_s <= t <= load_s and v >= 0 and not math.isnan(v)]
    if len(pts) < min_samples:
        return Check(name, False, f"cannot judge: {len(pts)} samples after the warm-up, needs {min_samples}")
    quarter = (load_s - warmup_s) / 4
    first = [v for t, v in pts if t < warmup_s + quarter]
    last = [v for t, v in pts if t >= load_s - quarter]
    if not first or not last:
        return Check(name, False, f"cannot judge: {len(first)} samples in the first quarter, {len(last)} in the last")
    base, end = float(np.median(first)), float(np.median(last))
    allowed = max(allowed_abs, base * allowed_pct / 100)
    slope = slope_per_min([t for t, _ in pts], [v for _, v in pts])
    return Check(name, end - base <= allowed,
                 f"{base:.1f} -> {end:.1f} {unit} (median of the first vs the last quarter after the warm-up: "
                 f"{end - base:+.1f}, allowed +{allowed:.1f}); slope {slope:+.2f} {unit}/min; "
                 f"range {min(v for _, v in pts):.1f}-{max(v for _, v in pts):.1f} over {len(pts)} samples")


def process_stable(samples: Sequence[Sample], warmup_s: float, load_s: float, tol: Tolerances) -> list[Check]:
    """RSS, open fds and threads of the server not growing after the warm-up."""
    t = [s.t for s in samples]
    return [
        growth("server RSS not growing after warm-up", "MiB", t, [s.rss_mib for s in samples], warmup_s, load_s,
               tol.rss_mib, tol.rss_pct, tol.min_samples),
        growth("server open fds not growing after warm-up", "fds", t, [s.fds for s in samples], warmup_s, load_s,
               tol.fds, 0.0, tol.min_samples),
        growth("server threads not growing after warm-up", "threads", t, [s.threads for s in samples], warmup_s,
               load_s, tol.threads, 0.0, tol.min_samples),
    ]


# -- requests -------------------------------------------------------------------------------

CUT = (CLIENT_CANCELLED, TIMED_OUT)
EXERCISED = (COMPLETED, CLIENT_CANCELLED, REJECTED)


def request_checks(jobs: Sequence[Job], outcomes: Sequence[Outcome], finished: Mapping[str, int]) -> list[Check]:
    """Over the whole run: each request ended exactly once (none lost, duplicated or hung), clearly
    (a full response, a deliberate cancel, an expected 4xx with OpenAI's body, a 429), with well
    formed responses and unique response ids; and the server's finish counters (`finished`: their
    change over the load) agree with what the clients saw."""
    completed = sum(1 for o in outcomes if o.status == COMPLETED)
    cut = sum(1 for o in outcomes if o.status in CUT)
    well_formed = sum(1 for j in jobs if j.kind != "malformed") - sum(1 for o in outcomes if o.status == OVERLOADED)
    return [
        inv.one_outcome_per_request(jobs, outcomes),
        inv.no_decode_failure(outcomes),
        inv.clear_outcomes(jobs, outcomes),
        inv.server_responses_well_formed(outcomes),
        inv.server_accounting(completed, cut, well_formed, finished),
    ]


def endings_exercised(outcomes: Sequence[Outcome], required: Sequence[str] = EXERCISED) -> Check:
    """The mix really happened: completions, client cancellations and refused malformed requests
    (a soak that never cancelled says nothing about cancellation)."""
    seen = Counter(o.status for o in outcomes)
    missing = [s for s in required if not seen.get(s)]
    return Check("every kind of ending occurred", not missing,
                 ", ".join(f"{k}={v}" for k, v in sorted(seen.items())) + (f"; none {missing}" if missing else ""))


def verdict(checks: Sequence[Check]) -> bool:
    return bool(checks) and all(c.ok for c in checks)
