"""ggml's CPU matmul, type by type: with batch-invariant mode a column's result does not
depend on how many columns share the call (1 to 64), for every weight type our models use
and the common ones they do not (F16, Q4_0, Q5_1, Q5_K)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _harness import build_harness, public_api_flags, run_harness

pytestmark = pytest.mark.invariance

HARNESS = Path(__file__).with_name("matmul_columns.c")


@pytest.fixture(scope="module")
def measured(native_build, tmp_path_factory) -> dict[tuple[str, str], float]:
    exe = build_harness(native_build, HARNESS, tmp_path_factory.mktemp("harness"), public_api_flags(native_build))
    return {(mode, type_name): float(worst) for mode, type_name, worst in run_harness(exe)}


@pytest.mark.parametrize("type_name", ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"])
def test_a_column_is_the_same_bytes_at_any_batch_size(measured, type_name):
    assert measured[("on", type_name)] == 0.0


def test_the_default_kernels_do_depend_on_the_batch(measured):
    """Not a requirement, a check that the harness can see a difference at all."""
    assert any(worst > 0 for (mode, _), worst in measured.items() if mode == "off")
