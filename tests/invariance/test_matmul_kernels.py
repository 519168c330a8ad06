"""ggml's CPU matmul, type by type: with batch-invariant mode a column's result does not
depend on how many columns share the call (1 to 64), for every weight type our models use
and the common ones they do not (F16, BF16, Q4_0, Q5_1, Q5_K); and a token's MoE expert rows
(MUL_MAT_ID) do not depend on how many tokens are routed to the same experts, nor a batched
matmul's columns (src0 broadcast over src1's batches). Column counts below 8 (AVX512-VNNI) or 13
(AVX2, patch 0019) and above take different kernels for the K-quants (patch 0009's gemv and the
tiled kernel), and one column
and more take different tile shapes in tinyBLAS, so these tests hold them to the same bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from _harness import build_harness, public_api_flags, run_harness

pytestmark = pytest.mark.invariance

HARNESS = Path(__file__).with_name("matmul_columns.c")


@pytest.fixture(scope="module")
def measured(native_build, tmp_path_factory) -> dict[tuple[str, str, str], float]:
    exe = build_harness(native_build, HARNESS, tmp_path_factory.mktemp("harness"), public_api_flags(native_build))
    return {(mode, op, type_name): float(worst) for mode, op, type_name, worst in run_harness(exe)}


TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"]


@pytest.mark.parametrize("type_name", TYPES)
def test_a_column_is_the_same_bytes_at_any_batch_size(measured, type_name):
    assert measured[("on", "mul_mat", type_name)] == 0.0


@pytest.mark.parametrize("type_name", TYPES)
def test_a_tokens_expert_rows_are_the_same_bytes_however_many_tokens_share_them(measured, type_name):
    assert measured[("on", "mul_mat_id", type_name)] == 0.0


@pytest.mark.parametrize("type_name", TYPES)
def test_a_batched_matmuls_columns_are_the_same_bytes_at_any_column_count(measured, type_name):
    """src0 broadcast over src1's batches, as MLA's per-head matrices are."""
    assert measured[("on", "mul_mat_batched", type_name)] == 0.0


@pytest.mark.parametrize("op", ["mul_mat", "mul_mat_id", "mul_mat_batched"])
def test_the_default_kernels_do_depend_on_the_batch(measured, op):
    """Not a requirement, a check that the harness can see a difference at all."""
    assert any(worst > 0 for (mode, o, _), worst in measured.items() if mode == "off" and o == op)


AGREE = 1e-5  # relative to the largest |output|: f32 rounding of K = 1024 products summed in another order


@pytest.mark.parametrize("type_name", TYPES)
def test_an_invariant_column_agrees_with_the_default_kernels(measured, type_name):
    """Invariance alone would pass a kernel that is consistently wrong: every invariant column (1 to 64 in
    the call) must also match upstream's own one-column result (vec_dot) to rounding. Q4_1 has no upstream
    tinyBLAS path; patch 0015's kernel is held to vec_dot here."""
    assert measured[("agree", "mul_mat", type_name)] <= AGREE
