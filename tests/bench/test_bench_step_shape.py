"""bench/step_shape.py: the engine's step-cost model's error on mixed steps, from (decode rows, prompt tokens, seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.step_shape import model_error  # noqa: E402


def _grid(cost) -> list[tuple[int, int, float]]:
    return [(d, p, cost(d, p)) for d in (0, 1, 8, 32) for p in (0, 16, 128, 480) if d + p] * 3


@pytest.mark.parametrize("per_row", [0.003, 0.006])
def test_the_shape_model_predicts_mixed_steps_whatever_a_row_costs_beside_a_prompt_token(per_row):
    """A dearer decode row than a prompt token is what a one-line fit could not follow; the shape model can."""
    err = model_error(_grid(lambda d, p: 0.004 + per_row * d + 0.003 * p))
    assert err["per_row_ms"] == pytest.approx(1e3 * per_row, rel=0.05)
    assert err["per_token_ms"] == pytest.approx(3.0, rel=0.05)
    assert -0.05 < err["mixed_rel_error_min"] <= err["mixed_rel_error_max"] < 0.05
