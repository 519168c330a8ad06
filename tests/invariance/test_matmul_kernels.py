"""ggml's CPU matmul, type by type: with batch-invariant mode a column's result does not
depend on how many columns share the call (1 to 64), for every weight type our models use
and the common ones they do not (F16, Q4_0, Q5_1, Q5_K)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.invariance

HARNESS = Path(__file__).with_name("matmul_columns.c")


@pytest.fixture(scope="module")
def measured(native_build, tmp_path_factory) -> dict[tuple[str, str], float]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the kernel harness (the native build needs one too)")
    exe = tmp_path_factory.mktemp("harness") / "matmul_columns"
    lib = native_build.lib_dir
    subprocess.run(
        [cc, "-O2", str(HARNESS), f"-I{native_build.src / 'ggml' / 'include'}", f"-L{lib}",
         "-lggml", "-lggml-base", "-lggml-cpu", "-lm", f"-Wl,-rpath,{lib}", "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=300).stdout
    rows = {}
    for line in out.splitlines():
        mode, type_name, worst = line.split()
        rows[(mode, type_name)] = float(worst)
    return rows


@pytest.mark.parametrize("type_name", ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"])
def test_a_column_is_the_same_bytes_at_any_batch_size(measured, type_name):
    assert measured[("on", type_name)] == 0.0


def test_the_default_kernels_do_depend_on_the_batch(measured):
    """Not a requirement, a check that the harness can see a difference at all."""
    assert any(worst > 0 for (mode, _), worst in measured.items() if mode == "off")
