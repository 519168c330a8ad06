"""bench/n1_timeline.py: the per-token split between two decodes, from the worker's trace and the receive times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import n1_timeline as T


def _trace(n: int, decode: float, work: float, wait: float) -> tuple[list, list]:
    """n decodes of `decode` s; each wake-up `work` s after its decode's end; the next decode `wait` s after it."""
    trace, recv, t = [], [], 0.0
    for _ in range(n):
        trace.append(("decode", t, t + decode))
        trace.append(("wake", t + decode + work, 0.0))
        recv.append(t + decode + work + 0.0001)
        t += decode + work + wait
    return trace, recv


def test_a_steady_trace_splits_into_decode_work_and_wait():
    trace, recv = _trace(40, 0.007, 0.00012, 0.00033)
    b = T.breakdown(trace, recv)
    assert b["decode_ms"] == pytest.approx(7.0)
    assert b["worker_us"] == pytest.approx(120)
    assert b["to_next_decode_us"] == pytest.approx(330)
    assert b["tpot_ms"] == pytest.approx(7.45)


def test_the_first_tokens_do_not_count():
    trace, recv = _trace(40, 0.007, 0.00012, 0.00033)
    trace[0] = ("decode", 0.0, 0.250)  # the prefill: long, and before the steady part
    b = T.breakdown(trace, recv)
    assert b["decode_ms"] == pytest.approx(7.0)


def test_a_wake_up_outside_a_gap_is_not_paired():
    trace, recv = _trace(40, 0.007, 0.00012, 0.00033)
    trace = [e for i, e in enumerate(trace) if not (e[0] == "wake" and i % 4 == 1)]  # every other wake-up lost
    b = T.breakdown(trace, recv)
    assert b["worker_us"] == pytest.approx(120) and b["to_next_decode_us"] == pytest.approx(330)
    none = T.breakdown([e for e in trace if e[0] == "decode"], recv)
    assert math.isnan(none["worker_us"]) and math.isnan(none["to_next_decode_us"])


def test_the_wrappers_record_and_delegate(monkeypatch):
    import skippy.runtime as runtime
    from skippy.actors.worker import Worker

    calls = []

    def original(decode, *args, **kwargs):
        return decode(*args) * 2

    monkeypatch.setattr(runtime, "decode_then_sample", original)
    monkeypatch.setattr(Worker, "_finished", lambda self: calls.append("finished"))
    T.TRACE.clear()
    T._instrument()
    assert runtime.decode_then_sample(lambda x: x + 1, np.int64(3)) == 8
    Worker._finished(object())
    assert calls == ["finished"] and [k for k, *_ in T.TRACE] == ["decode", "wake"]
    (_, t0, t1), (_, tw, _) = T.TRACE
    assert t0 <= t1 <= tw
