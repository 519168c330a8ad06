"""bench/step_shape.py: the one-line cost model's error on mixed steps, from (decode rows, prompt tokens, seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.step_shape import model_error  # noqa: E402


def _grid(cost) -> list[tuple[int, int, float]]:
    return [(d, p, cost(d, p)) for d in (0, 1, 8, 32) for p in (0, 16, 128, 480) if d + p]


def test_steps_on_one_line_are_predicted_exactly():
    err = model_error(_grid(lambda d, p: 0.004 + 0.003 * (d + p)))
    assert err["fixed_ms"] == pytest.approx(4.0) and err["per_token_ms"] == pytest.approx(3.0)
    assert err["mixed_rel_error_min"] == pytest.approx(0, abs=1e-9)
    assert err["mixed_rel_error_max"] == pytest.approx(0, abs=1e-9)


def test_dearer_decode_rows_make_the_one_line_fit_miss_mixed_steps():
    err = model_error(_grid(lambda d, p: 0.004 + 0.006 * d + 0.003 * p))
    assert err["mixed_rel_error_max"] - err["mixed_rel_error_min"] > 0.1  # no single line fits both costs
