"""Patch 0005: the fp16 vector tails give the scalar loops' bytes, for every head size in our
models (64, 80, 128, 256) and the odd sizes around the vector widths. The harness is compiled
with ggml-cpu's own flags, read from the build, so its reference loops are contracted (or not)
into FMAs exactly as the library's scalar loop is. mad and scale are inline in vec.h, so the
harness also compiles them for the other x86 branches this CPU can run: AVX512F without FP16
(16-wide steps of 64) and AVX2 (8-wide steps of 32). dot comes from the library (this CPU's
branch) in every build."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest
from _harness import build_harness, run_harness

pytestmark = pytest.mark.native

HARNESS = Path(__file__).with_name("vec_f16_tails.cpp")
HEAD_SIZES = (64, 80, 128, 256)


# x86 branches besides the build's own (-march=native): what each needs from the CPU to run
OTHER_BRANCHES = {"skylake-avx512": {"avx512f", "avx512bw", "avx512vl", "f16c", "fma"}, "haswell": {"avx2", "f16c", "fma"}}


def _ggml_cpu_flags(build, march: str) -> list[str]:
    flags = build.build_dir / "ggml" / "src" / "CMakeFiles" / "ggml-cpu.dir" / "flags.make"
    values = dict(re.findall(r"^(CXX_DEFINES|CXX_INCLUDES|CXX_FLAGS) = (.*)$", flags.read_text(), re.M))
    cxx_flags = [f"-march={march}" if f == "-march=native" else f for f in values["CXX_FLAGS"].split()]
    return [*values["CXX_DEFINES"].split(), *values["CXX_INCLUDES"].split(), *cxx_flags]


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _branches() -> list[str]:
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["native"]
    cpu = _cpu_flags()
    return ["native", *(march for march, needs in OTHER_BRANCHES.items() if needs <= cpu)]


@pytest.fixture(scope="module", params=_branches())
def measured(request, native_build, tmp_path_factory) -> dict[tuple[str, int], float]:
    exe = build_harness(native_build, HARNESS, tmp_path_factory.mktemp("harness"),
                        _ggml_cpu_flags(native_build, request.param), ("-lggml-cpu", "-lggml-base"), ("c++", "g++"))
    rows = {(check, int(n)): float(value) for check, n, value in run_harness(exe, timeout=120)}
    assert {n for _, n in rows} >= set(HEAD_SIZES)
    return rows


@pytest.mark.parametrize("check", ["mad_tail", "mad", "scale_tail", "scale"])
def test_tails_are_the_scalar_loops_bytes(measured, check):
    bad = {n: int(v) for (c, n), v in measured.items() if c == check and v != 0}
    assert bad == {}, f"{check}: elements differing from the scalar loop, by size: {bad}"


def test_dot_is_deterministic_and_accurate(measured):
    assert all(v == 0 for (c, _), v in measured.items() if c == "dot_unstable")
    worst = max(v for (c, _), v in measured.items() if c == "dot_error")
    assert worst < 1e-5  # relative to sum |x*y|: fp32 accumulation of fp16 products
