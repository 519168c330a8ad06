"""bench/served_ab.py's per-thread CPU split: the busiest threads are compute, the rest overhead."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.served_ab import compute_and_other_s, engine_argv, other_sys_s, thread_cpu_ns, thread_sys_s  # noqa: E402


def test_the_busiest_threads_count_as_compute_and_the_rest_as_overhead():
    before = {"1": 0, "2": 0, "3": 0}
    after = {"1": 5_000_000_000, "2": 4_000_000_000, "3": 300_000_000, "4": 20_000_000}  # "4": a new thread
    assert compute_and_other_s(before, after, 2) == (9.0, 0.32)
    assert compute_and_other_s(before, after, 1) == (5.0, 4.32)


def test_kernel_time_counts_only_the_threads_that_are_not_compute():
    cpu0 = {"1": 0, "2": 0, "3": 0}
    cpu1 = {"1": 5_000_000_000, "2": 4_000_000_000, "3": 300_000_000}
    sys0 = {"1": 1.0, "2": 1.0, "3": 0.5}
    sys1 = {"1": 1.5, "2": 1.25, "3": 0.625, "4": 0.0625}  # "4": a thread started meanwhile
    assert other_sys_s(cpu0, cpu1, sys0, sys1, 2) == 0.1875


def test_syscalls_show_as_kernel_time_of_the_thread_that_made_them():
    mine = str(threading.get_native_id())
    before = thread_sys_s(os.getpid())[mine]
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        os.getppid(), os.stat("/")  # syscalls only
    assert thread_sys_s(os.getpid())[mine] - before >= 0.05


def test_a_thread_that_burns_cpu_shows_in_its_own_counter():
    tid: list[int] = []
    burnt, release = threading.Event(), threading.Event()

    def burn() -> None:
        tid.append(threading.get_native_id())
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        burnt.set()
        release.wait(10)

    before = thread_cpu_ns(os.getpid())
    t = threading.Thread(target=burn)
    t.start()
    try:
        assert burnt.wait(10)
        after = thread_cpu_ns(os.getpid())
    finally:
        release.set()
        t.join()
    mine = str(threading.get_native_id())
    assert after[str(tid[0])] - before.get(str(tid[0]), 0) >= 0.15e9  # its 0.2 s, on its own counter
    assert after[mine] - before[mine] < 0.15e9  # not on the thread that waited
    compute, other = compute_and_other_s(before, after, 1)
    assert compute >= 0.15 and other < compute


def test_an_engine_spec_carries_extra_args_and_environment_variables():
    from bench.gate.engines import ServerConfig
    from bench.gate.model import ModelSpec

    cfg = ServerConfig(ModelSpec("m", None, Path("/models/m.gguf")), threads=2, n_ctx=1024, n_batch=64)
    plain = engine_argv("skippy", cfg, 8000, Path("/tools"))
    assert plain[:3] == [sys.executable, "-m", "skippy"] and "env" not in plain
    argv = engine_argv("skippy-fast:GOMP_SPINCOUNT=3000 --no-prefix-cache", cfg, 8000, Path("/tools"))
    # env(1) execs the server, so the pid the A/B reads CPU from is still the server's
    assert argv[:2] == ["env", "GOMP_SPINCOUNT=3000"] and argv[2:5] == [sys.executable, "-m", "skippy"]
    assert argv[-1] == "--no-prefix-cache" and "--no-batch-invariant" in argv
    assert engine_argv("llama-server:--cache-ram=0", cfg, 8000, Path("/tools"))[-1] == "--cache-ram=0"
