"""bench/cpu_per_token.py: thread groups from /proc readings, and the per-token difference of a request pair."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.cpu_per_token import per_token, split_ns  # noqa: E402


def test_the_busiest_threads_are_compute_and_the_main_thread_is_read_apart():
    before = {"100": 1_000, "101": 0, "102": 0, "103": 50}
    after = {"100": 4_000, "101": 20_000, "102": 18_000, "103": 60, "104": 7}  # 104 started meanwhile
    compute, other, main = split_ns(before, after, n_compute=2, main_tid="100")
    assert (compute, other, main) == (38_000, 3_000 + 10 + 7, 3_000)


def test_per_token_is_the_long_request_less_the_short_one_over_the_extra_tokens():
    short, long = (1_000_000, 200_000, 100_000), (3_560_000, 456_000, 228_000)
    assert per_token(short, long, 256) == pytest.approx((10.0, 1.0, 0.5))
