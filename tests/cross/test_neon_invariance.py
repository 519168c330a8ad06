"""The ARM (NEON) path of our ggml patches builds and stays exact: the patched tree cross-built for
aarch64 (armv8.2-a + dotprod + fp16), and the host's kernel-level invariance harness
(tests/invariance/matmul_columns.c) run under qemu-user with the same checks as on the host: a
column's bytes do not depend on how many columns share the call, in every op and weight type, and an
invariant column agrees with upstream's one-column result. Needs the cross toolchain and qemu-user
(`apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user libc6-dev-arm64-cross`);
without them it is skipped, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import _aarch64

pytestmark = [pytest.mark.native, pytest.mark.invariance]

HARNESS = Path(__file__).parents[1] / "invariance" / "matmul_columns.c"
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"]
AGREE = 1e-5  # as on the host (tests/invariance/test_matmul_kernels.py)
# F16 on NEON with fp16 vector arithmetic: tinyBLAS and vec_dot both accumulate in half precision (in
# other orders), so they agree to fp16 rounding of K = 1024 products, not f32 rounding
AGREE_BY_TYPE = {"f16": 5e-3}


@pytest.fixture(scope="module")
def measured(native_build, tmp_path_factory) -> dict[tuple[str, str, str], float]:
    lacking = _aarch64.missing()
    if lacking:
        pytest.skip(f"no aarch64 cross toolchain / qemu-user here (missing {', '.join(lacking)}): {_aarch64.INSTALL}")
    out = native_build.root.parent / f"{native_build.root.name}-aarch64"
    build = _aarch64.build_ggml(native_build.src, out)
    exe = _aarch64.build_harness(native_build.src, build, HARNESS, tmp_path_factory.mktemp("neon") / "matmul_columns")
    return {(mode, op, t): float(worst) for mode, op, t, worst in _aarch64.run(exe, timeout=1800)}


@pytest.mark.parametrize("op", ["mul_mat", "mul_mat_id", "mul_mat_batched"])
@pytest.mark.parametrize("type_name", TYPES)
def test_on_neon_a_column_is_the_same_bytes_at_any_batch_size(measured, op, type_name):
    assert measured[("on", op, type_name)] == 0.0


@pytest.mark.parametrize("type_name", TYPES)
def test_on_neon_an_invariant_column_agrees_with_the_default_kernels(measured, type_name):
    assert measured[("agree", "mul_mat", type_name)] <= AGREE_BY_TYPE.get(type_name, AGREE)


def test_on_neon_the_default_kernels_do_depend_on_the_batch(measured):
    """Not a requirement: that the harness sees a difference at all under emulation."""
    assert any(worst > 0 for (mode, _, _), worst in measured.items() if mode == "off")
