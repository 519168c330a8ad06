"""The soak (stress/soak.py): its pass criteria catch what they claim to (pure, hand-made series),
its request stream is what it says, and a CI-sized minute of it against `skippy serve` on the
tiny synthetic llama passes, writing soak.json, summary.md and soak.png."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import trio

from stress import soak
from stress import soak_checks as sc
from stress.outcomes import CLIENT_CANCELLED, COMPLETED, HUNG, REJECTED, TIMED_OUT, Outcome
from stress.workload import Job

TOL = sc.Tolerances()
REPO = Path(__file__).resolve().parents[2]


def noisy(n: int, level: float, noise: float, seed: int = 0, slope: float = 0.0) -> list[float]:
    """n samples, one a second: level + slope * t (per second) + uniform noise."""
    rng = np.random.default_rng(seed)
    return [level + slope * t + float(rng.uniform(-noise, noise)) for t in range(n)]


def samples(rss: list[float], fds: list[int] | None = None, threads: list[int] | None = None) -> list[sc.Sample]:
    fds = fds or [20] * len(rss)
    threads = threads or [3] * len(rss)
    return [sc.Sample(float(t), r, f, th) for t, (r, f, th) in enumerate(zip(rss, fds, threads))]


# -- growth ---------------------------------------------------------------------------------


def test_flat_noisy_memory_passes_and_steady_growth_fails():
    t = [float(i) for i in range(120)]
    flat = sc.growth("rss", "MiB", t, noisy(120, 100, 3), warmup_s=10, load_s=120, allowed_abs=8, allowed_pct=5)
    assert flat.ok, flat.detail
    leak = noisy(120, 100, 3, slope=0.15)  # +18 MiB over two minutes: ~+12 between the quarters' medians
    check = sc.growth("rss", "MiB", t, leak, warmup_s=10, load_s=120, allowed_abs=8, allowed_pct=5)
    assert not check.ok and "allowed +8.0" in check.detail, check.detail
    assert "slope +9" in check.detail  # ~9 MiB/min


def test_growth_during_the_warm_up_or_a_burst_is_not_a_leak():
    t = [float(i) for i in range(120)]
    warm = [60 + min(i, 10) * 4.0 for i in range(120)]  # 60 -> 100 MiB in the first 10 s, flat after
    assert sc.growth("rss", "MiB", t, warm, 10, 120, 8, 5).ok
    burst = [100.0] * 120
    burst[110:113] = [160.0, 170.0, 150.0]  # a spike in the last quarter moves its median little
    assert sc.growth("rss", "MiB", t, burst, 10, 120, 8, 5).ok


def test_the_percentage_tolerance_applies_to_large_processes():
    t = [float(i) for i in range(100)]
    big = [1000.0] * 50 + [1040.0] * 50  # +40 MiB on 1 GiB: within 5%
    assert sc.growth("rss", "MiB", t, big, 0, 100, 8, 5).ok
    assert not sc.growth("rss", "MiB", t, big, 0, 100, 8, 2).ok


def test_growth_without_evidence_fails():
    t = [0.0, 1.0, 2.0, 3.0]
    check = sc.growth("rss", "MiB", t, [1.0, 1.0, 1.0, 1.0], 0, 4, 8, 5, min_samples=8)
    assert not check.ok and "cannot judge" in check.detail
    unreadable = [float("nan")] * 60 + [100.0] * 4  # the process stopped answering /proc
    assert not sc.growth("rss", "MiB", [float(i) for i in range(64)], unreadable, 0, 64, 8, 5).ok
    assert not sc.growth("fds", "fds", [float(i) for i in range(64)], [-1] * 64, 0, 64, 16).ok


def test_fds_or_threads_that_keep_growing_fail_the_process_checks():
    n = 120
    fine = sc.process_stable(samples(noisy(n, 90, 1)), 10, 120, TOL)
    assert [c.ok for c in fine] == [True, True, True], [c.detail for c in fine]
    leaking_fds = samples(noisy(n, 90, 1), fds=[10 + i // 3 for i in range(n)])  # a socket every 3 s
    assert [c.ok for c in sc.process_stable(leaking_fds, 10, 120, TOL)] == [True, False, True]
    leaking_threads = samples(noisy(n, 90, 1), threads=[3 + i // 10 for i in range(n)])
    assert [c.ok for c in sc.process_stable(leaking_threads, 10, 120, TOL)] == [True, True, False]
    leaking_rss = samples(noisy(n, 90, 1, slope=0.2))
    assert [c.ok for c in sc.process_stable(leaking_rss, 10, 120, TOL)] == [False, True, True]


# -- latency --------------------------------------------------------------------------------


def finishes(t0: float, t1: float, n: int, total: float, ttft: float, seed: int = 0) -> list[sc.Finish]:
    rng = np.random.default_rng(seed)
    return [sc.Finish(float(t), COMPLETED, 0.0, ttft * float(rng.uniform(0.5, 1.0)),
                      total * float(rng.uniform(0.5, 1.0))) for t in np.linspace(t0, t1, n, endpoint=False)]


def test_windows_tile_the_steady_part_and_end_with_the_load():
    assert sc.steady_edges(6, 60, 15) == [15, 30, 45, 60]
    assert sc.steady_edges(10, 60, 10) == [10, 20, 30, 40, 50, 60]
    assert sc.steady_edges(50, 60, 15) == []
    fs = finishes(0, 60, 600, total=0.2, ttft=0.05) + [sc.Finish(30.0, CLIENT_CANCELLED, 2.0)]
    ws = sc.windows(fs, [0, 30, 60])
    assert [w.n for w in ws] == [300, 300]
    assert ws[1].lag_max == 2.0  # a cut request still shows its client's lag
    assert 0.19 < ws[0].total_p99 <= 0.2 and 0.1 < ws[0].total_p50 < 0.16
    assert sc.percentile([], 99) is None and sc.percentile([1.0, 2.0], 50) == 1.5


def test_stable_latency_passes_and_a_drifting_p99_fails():
    steady = sc.windows(finishes(0, 60, 600, total=0.3, ttft=0.05), [0, 20, 40, 60])
    assert all(c.ok for c in sc.latency_stable(steady, TOL))
    drifting = finishes(0, 40, 400, total=0.3, ttft=0.05) + finishes(40, 60, 200, total=1.2, ttft=0.4, seed=1)
    ttft, total = sc.latency_stable(sc.windows(drifting, [0, 20, 40, 60]), TOL)
    assert not ttft.ok and not total.ok
    assert "1.5 x first + 0.1" in total.detail and total.detail.startswith("0.299 s in [0, 20) s -> 1.188 s")


def test_a_small_absolute_change_stays_within_the_slack():
    fast = finishes(0, 20, 200, total=0.010, ttft=0.002) + finishes(20, 40, 200, total=0.080, ttft=0.05, seed=1)
    assert all(c.ok for c in sc.latency_stable(sc.windows(fast, [0, 20, 40]), TOL))  # 8x, but +70 ms


def test_latency_without_evidence_fails():
    one = sc.windows(finishes(0, 20, 200, total=0.3, ttft=0.05), [0, 20])
    assert not any(c.ok for c in sc.latency_stable(one, TOL))
    sparse = sc.windows(finishes(0, 40, 20, total=0.3, ttft=0.05), [0, 20, 40])  # 10 per window < 20
    checks = sc.latency_stable(sparse, TOL)
    assert not any(c.ok for c in checks) and "cannot judge" in checks[0].detail
    no_stream = [sc.Finish(f.t, f.status, 0.0, None, f.total_s) for f in finishes(0, 40, 400, 0.3, 0.05)]
    ttft, total = sc.latency_stable(sc.windows(no_stream, [0, 20, 40]), TOL)
    assert not ttft.ok and total.ok


# -- requests -------------------------------------------------------------------------------


def job(i: int, kind: str = "complete") -> Job:
    return Job(id=f"r0-{i}", kind=kind, prompt=(), max_tokens=4)


def done(i: int, rid: str | None = None) -> Outcome:
    return Outcome(f"r0-{i}", "complete", COMPLETED, "length", max_tokens=4, finals=1, done=1, completion_tokens=4,
                   chunks=4, response_ids=[rid or f"cmpl-{i}"], http_status=200)


def run_of_four() -> tuple[list[Job], list[Outcome], dict[str, int]]:
    jobs = [job(0), job(1), job(2, "cancel"), job(3, "malformed")]
    outs = [done(0), done(1), Outcome("r0-2", "cancel", CLIENT_CANCELLED),
            Outcome("r0-3", "malformed", REJECTED, http_status=400, expected_status=400, error_body_ok=True)]
    return jobs, outs, {"length": 2, "cancelled": 1, "error": 0}


def test_a_clean_run_passes_the_request_checks():
    jobs, outs, finished = run_of_four()
    checks = sc.request_checks(jobs, outs, finished) + [sc.endings_exercised(outs)]
    assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
    assert sc.verdict(checks)


def test_a_lost_duplicated_or_hung_request_fails():
    jobs, outs, finished = run_of_four()
    assert not sc.verdict(sc.request_checks(jobs, outs[1:], finished))  # r0-0 lost
    assert not sc.verdict(sc.request_checks(jobs, outs + [done(1, "cmpl-x")], finished))  # r0-1 ended twice
    hung = Outcome("r0-1", "complete", HUNG)
    assert not sc.verdict(sc.request_checks(jobs, [outs[0], hung] + outs[2:], finished))
    shared = [done(0), done(1, "cmpl-0")] + outs[2:]  # one response delivered to two requests
    assert not sc.verdict(sc.request_checks(jobs, shared, finished))


def test_unclear_endings_and_bad_server_accounting_fail():
    jobs, outs, finished = run_of_four()
    no_body = Outcome("r0-3", "malformed", REJECTED, http_status=400, expected_status=400, error_body_ok=False)
    assert not sc.verdict(sc.request_checks(jobs, outs[:3] + [no_body], finished))
    timed_out_plain = Outcome("r0-1", "complete", TIMED_OUT)  # a plain completion may not time out
    assert not sc.verdict(sc.request_checks(jobs, [outs[0], timed_out_plain] + outs[2:], finished))
    assert not sc.verdict(sc.request_checks(jobs, outs, {"length": 2, "cancelled": 1, "error": 1}))
    assert not sc.verdict(sc.request_checks(jobs, outs, {"length": 5}))  # finished more than were sent


def test_a_mix_that_never_cancelled_is_not_exercised():
    _, outs, _ = run_of_four()
    assert sc.endings_exercised(outs).ok
    check = sc.endings_exercised([o for o in outs if o.status != CLIENT_CANCELLED])
    assert not check.ok and "client_cancelled" in check.detail
    assert not sc.verdict([])


# -- the request stream and the files -------------------------------------------------------


def test_the_request_stream_is_seeded_open_loop_at_the_rate():
    shape = soak.SoakConfig().shape((260, 512))
    a = list(zip(range(3000), soak.poisson_jobs(shape, seed=1, rate=50.0)))
    b = list(zip(range(3000), soak.poisson_jobs(shape, seed=1, rate=50.0)))
    assert a == b
    jobs = [j for _, j in a]
    assert len({j.id for j in jobs}) == 3000
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals) and 45 < 3000 / arrivals[-1] < 55
    kinds = {j.kind for j in jobs}
    assert kinds == {"complete", "cancel", "disconnect", "timeout", "malformed"}
    assert any(j.chat for j in jobs) and any(soak.streamed(j) for j in jobs) and not all(soak.streamed(j) for j in jobs)


def test_the_defaults_scale_with_the_run():
    one, long = soak.SoakConfig(minutes=1), soak.SoakConfig(minutes=25)
    assert (one.warmup, one.window, one.sample_every) == (6.0, 15.0, 1.0)
    assert (long.warmup, long.window, long.sample_every) == (120.0, 120.0, 5.0)
    assert len(sc.steady_edges(long.warmup, long.load_s, long.window)) - 1 == 11
    cfg = soak.config_from(soak.parser().parse_args(["--minutes", "2", "--rate", "9", "--p99-factor", "2"]),
                           ["--minutes", "2", "--rate", "9", "--p99-factor", "2"])
    assert cfg.rate == 9 and cfg.tolerances.p99_factor == 2 and cfg.family == "llama"
    assert cfg.command == "python -m stress.soak --minutes 2 --rate 9 --p99-factor 2"


def fake_result(ok: bool) -> dict:
    ss = [sc.Sample(float(t), 90.0 + math.sin(t), 20, 3, 500, 400, 2, 0, 3, 10 * t, 0.4 * t, 1.5)
          for t in range(-1, 70)]
    ws = sc.windows(finishes(0, 60, 600, 0.3, 0.05), [15, 30, 45, 60])
    cfg = soak.SoakConfig()
    return {"name": "soak", "ok": ok, "command": "python -m stress.soak --minutes 1", "provenance": {},
            "config": {"minutes": 1}, "invariants": [{"name": "x", "ok": ok, "detail": "d"}],
            "totals": {"load_s": cfg.load_s, "warmup_s": cfg.warmup, "rate_per_s": 30.0, "requests": 1800},
            "windows": [attrs.asdict(w) for w in ws],
            "sample_latency": [attrs.asdict(w) for w in sc.windows(finishes(0, 60, 600, 0.3, 0.05), list(range(61)))],
            "samples": [attrs.asdict(s) for s in ss]}


def test_the_summary_and_the_plot_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    d = soak.write(fake_result(False), tmp_path / "soak-x")
    md = (d / "summary.md").read_text()
    assert "Result: **FAIL**" in md and "python -m stress.soak --minutes 1" in md and "![soak](soak.png)" in md
    assert json.loads((d / "soak.json").read_text())["ok"] is False
    assert (d / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- a CI-sized minute against the real server ----------------------------------------------


@pytest.mark.stress
@pytest.mark.native
async def test_a_one_minute_soak_passes(synth_model_path, tmp_path):
    """python -m stress.soak --minutes 1 on the tiny synthetic llama: every criterion holds, every
    kind of ending happened, and the three files are written."""
    synth_model_path("llama")
    out = tmp_path / "soak-ci"
    argv = [sys.executable, "-m", "stress.soak", "--minutes", "1", "--seed", "0", "--family", "llama", "--quiet",
            "--out", str(out)]
    with trio.fail_after(300):
        proc = await trio.run_process(argv, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False)
    err = proc.stderr.decode()
    result = json.loads((out / "soak.json").read_text())
    failed = [f"{c['name']}: {c['detail']}" for c in result["invariants"] if not c["ok"]]
    assert proc.returncode == 0 and result["ok"], (failed, err[-3000:])
    line = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert line["ok"] and line["failed"] == []
    totals = result["totals"]
    assert totals["requests"] >= 300, totals  # a meaningful minute: hundreds of requests
    assert {"completed", "client_cancelled", "rejected"} <= set(totals["outcomes"]), totals["outcomes"]
    assert {"200", "400", "404"} <= set(totals["http_statuses"]), totals["http_statuses"]
    assert len(result["windows"]) >= 2 and len(result["samples"]) >= 30
    assert result["command"].startswith("python -m stress.soak --minutes 1")
    assert "Result: **PASS**" in (out / "summary.md").read_text()
    assert (out / "soak.png").stat().st_size > 10_000
