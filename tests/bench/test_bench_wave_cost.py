"""bench/wave_cost.py: tokens streamed before a wave's last first token, and the floor an ITL bound sets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.wave_cost import wave_cost  # noqa: E402


def _rec(t_send: float, ttft: float, itl: list[float], warmup: bool = False) -> dict:
    return {"t_send": t_send, "ttft": ttft, "itl": itl, "output_tokens": 1 + len(itl), "warmup": warmup}


def test_tokens_streamed_before_the_last_first_token_are_counted_and_the_floor_follows_the_bound():
    recs = [
        _rec(-5.0, 1.0, [1.0], warmup=True),  # warm-up: ignored, and not the wave's start
        _rec(0.0, 1.0, [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]),  # first token at 1.0, then 1.5 2.0 2.5 3.0 3.5 4.0
        _rec(0.0, 3.0, [0.5, 0.5]),  # the wave's last first token: 3.0, then 3.5 4.0
        _rec(3.2, 0.5, [0.1]),  # after the wave: a first token at 3.7, after t_last
    ]
    c = wave_cost(recs, wave=2, itl_bound_s=1.0)
    assert c["t_last"] == pytest.approx(3.0)
    assert c["streamed"] == 5 + 1  # 1.0 .. 3.0 of the first stream, and the last prompt's first token
    # stream 1: one token per second from 1.0 to 3.0 -> 3; stream 2 starts at t_last -> 1
    assert c["floor"] == 3 + 1


def test_the_floor_never_exceeds_what_a_stream_generates():
    recs = [_rec(0.0, 0.1, [0.01, 0.01]), _rec(0.0, 10.0, [])]
    assert wave_cost(recs, wave=2, itl_bound_s=0.5)["floor"] == 3 + 1


def test_too_few_requests_for_a_wave_is_an_error():
    with pytest.raises(ValueError, match="fewer than a wave"):
        wave_cost([_rec(0.0, 1.0, [])], wave=2, itl_bound_s=0.5)


def test_a_pooled_run_splits_into_its_rounds_in_stored_order():
    from bench.wave_cost import split_rounds

    recs = [_rec(t, 1.0, []) for t in (0.0, 1.0, 0.5, 6.0)]  # a warm-up may be sent before the shift
    first, second = split_rounds(recs, 2)
    assert [r["t_send"] for r in first] == [0.0, 1.0] and [r["t_send"] for r in second] == [0.5, 6.0]
    with pytest.raises(ValueError, match="equal rounds"):
        split_rounds(recs, 3)
