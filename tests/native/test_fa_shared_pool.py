"""Patches 0004/0012/0013/0014: flash attention over one pool shared by many sequences visits only each row's
own cells. Its exactness claim (the row kernel gives the same bytes) is checked against the
upstream walk, which SKIPPY_FA_SCAN_ALL=1 restores in the same build, at kernel level and on
real models' logits; its kernel choice (the row kernel instead of the tiled one over an
interleaved pool) is checked against a double-precision reference. The tiled kernel's band cases
(a prompt band with closed KV tiles either side) hold patch 0014's skipping to the upstream bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _harness import build_harness, public_api_flags, run_harness

pytestmark = pytest.mark.native

HERE = Path(__file__).parent
HARNESS = HERE / "fa_shared_pool.c"
CHILD = HERE / "_fa_logits.py"


def _env(scan_all: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SKIPPY_FA_SCAN_ALL", None)
    if scan_all:
        env["SKIPPY_FA_SCAN_ALL"] = "1"
    return env


@pytest.fixture(scope="module")
def kernel_runs(native_build, tmp_path_factory) -> dict[bool, dict[str, tuple[str, float]]]:
    """{scan_all: {case: (output hash, worst error vs the double reference)}}"""
    exe = build_harness(native_build, HARNESS, tmp_path_factory.mktemp("harness"), public_api_flags(native_build))
    runs = {scan_all: {case: (digest, float(worst)) for case, digest, worst in run_harness(exe, env=_env(scan_all))}
            for scan_all in (False, True)}
    assert runs[False].keys() == runs[True].keys() and len(runs[False]) == 56
    return runs


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


BLOCKED_KERNEL = {"avx2", "fma", "f16c"} <= _cpu_flags()  # patch 0020's kernel; the build is -march=native


@pytest.fixture(scope="module")
def row_kernel_runs(native_build, tmp_path_factory) -> dict[str, tuple[str, float]]:
    """The same cases with SKIPPY_FA_INV_ROWS=1: batch-invariant mode on the one-row kernel (before 0020)."""
    exe = build_harness(native_build, HARNESS, tmp_path_factory.mktemp("harness-rows"), public_api_flags(native_build))
    env = {**_env(False), "SKIPPY_FA_INV_ROWS": "1"}
    return {case: (digest, float(worst)) for case, digest, worst in run_harness(exe, env=env)}


def _tiled_candidate(case: str) -> bool:
    """Cases where upstream takes the tiled kernel: 64+ queries outside batch-invariant mode."""
    return ("_q96_" in case or "_q128_" in case) and "_default_" in case


def _split_declined(case: str) -> bool:
    """Patch 0013: one decode row over the interleaved 1024-cell pool opens about 64 cells, so the
    head-parallel path runs where upstream splits the pool (n_kv >= 512) between the threads."""
    return "_q1_interleaved_default_" in case


def test_row_kernel_outputs_are_the_same_bytes_as_the_upstream_walk(kernel_runs):
    exact = [case for case in kernel_runs[False]
             if not (_tiled_candidate(case) and "_band_" not in case) and not _split_declined(case)]
    assert len(exact) == 45
    for case in exact:
        assert kernel_runs[False][case][0] == kernel_runs[True][case][0], case


def test_an_interleaved_pool_takes_the_row_kernel_and_a_band_keeps_the_tiled_one(kernel_runs):
    """Over an interleaved pool the tiled kernel would compute every tile: the patch switches to
    the row kernel (other bytes: fp16 accumulation); a prompt band keeps the tiled kernel."""
    for case in kernel_runs[False]:
        if _tiled_candidate(case):
            same = kernel_runs[False][case][0] == kernel_runs[True][case][0]
            assert same == ("_band_" in case), case


def test_a_mixed_step_takes_the_row_kernel_though_its_middle_query_tile_is_one_prompt(kernel_runs):
    """Patch 0012: the choice counts every query tile. The middle tile of a mixed step (decode rows
    first, then a prompt chunk) alone says the tiled kernel; its first tile, the decodes of 15
    sequences over the whole pool, would then be computed densely."""
    mixed = [case for case in kernel_runs[False] if "_mixed_" in case and "_default_" in case]
    assert len(mixed) == 2
    for case in mixed:
        assert kernel_runs[False][case][0] != kernel_runs[True][case][0], case  # not upstream's tiled bytes


def test_a_decode_row_with_few_open_cells_is_not_split_over_the_pool(kernel_runs):
    """Patch 0013: upstream splits a single row's pool between the threads (split-KV); the row
    kernel visits only open cells, so one thread would get them all. The head-parallel path runs
    instead: other bytes than upstream's split (both within the reference bound, tested below). A
    banded row that opens 512 cells keeps the split (the exactness test above covers it)."""
    declined = [case for case in kernel_runs[False] if _split_declined(case)]
    assert len(declined) == 4
    for case in declined:
        assert kernel_runs[False][case][0] != kernel_runs[True][case][0], case  # not upstream's split bytes


@pytest.mark.parametrize("scan_all", [False, True], ids=["patched", "upstream-walk"])
def test_every_case_matches_the_double_precision_reference(kernel_runs, scan_all):
    for case, (_, worst) in kernel_runs[scan_all].items():
        assert worst < 5e-3, (case, worst)


def _logits_digest(path: Path, invariant: bool, n_ubatch: int, scan_all: bool) -> str:
    # upstream's split-KV choice in both runs (patch 0013 declines it for rows with few open cells,
    # and SKIPPY_FA_SCAN_ALL restores it): what differs is the cell walk alone
    env = {**_env(scan_all), "SKIPPY_FA_SPLIT_ALWAYS": "1"}
    out = subprocess.run(
        [sys.executable, str(CHILD), str(path), "1" if invariant else "0", str(n_ubatch)],
        check=True, capture_output=True, text=True, timeout=600, env=env,
    ).stdout
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next", "smollm2", "gemma3"])
def test_batch_invariant_logits_are_unchanged(name, request, synth_model_path):
    """Batch-invariant mode always takes the row kernel, walking cells in kv_order."""
    path = request.getfixturevalue(f"{name}_path") if name in ("smollm2", "gemma3") else synth_model_path(name)
    assert _logits_digest(path, True, 512, False) == _logits_digest(path, True, 512, True)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_default_mode_logits_are_unchanged_below_the_tiled_threshold(name, request):
    """Ubatches of 32 never reach the tiled kernel, so only the cell walk differs."""
    path = request.getfixturevalue(f"{name}_path")
    assert _logits_digest(path, False, 32, False) == _logits_digest(path, False, 32, True)


@pytest.mark.skipif(not BLOCKED_KERNEL, reason="patch 0020's blocked kernel is built for AVX2 + FMA + F16C only; "
                    "this CPU lacks one of them, so invariant mode keeps the one-row kernel")
def test_invariant_mode_takes_the_blocked_kernel_and_stays_within_the_reference(kernel_runs, row_kernel_runs):
    """Patch 0020: invariant rows go through the blocked kernel (f32 accumulation: other bytes than the
    one-row kernel's f16 accumulator in every invariant case), within the double-precision bound and no
    further from it than the one-row kernel; SKIPPY_FA_INV_ROWS changes nothing in default mode."""
    blocked = kernel_runs[False]
    assert blocked.keys() == row_kernel_runs.keys()
    invariant = [case for case in blocked if "_invariant_" in case]
    assert len(invariant) == 28
    for case in blocked:
        if "_invariant_" in case:
            assert blocked[case][0] != row_kernel_runs[case][0], case
            assert blocked[case][1] < 5e-3 and blocked[case][1] <= row_kernel_runs[case][1] * 1.01 + 1e-6, \
                (case, blocked[case][1], row_kernel_runs[case][1])
        else:
            assert blocked[case][0] == row_kernel_runs[case][0], case
