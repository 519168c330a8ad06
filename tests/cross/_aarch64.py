"""Cross-building the patched ggml for aarch64 (NEON) and running a harness under qemu-user: how the ARM
path is held to the same checks as the host's without an ARM machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

TOOLS = ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++", "qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")
# armv8.2-a with dot products and fp16 arithmetic: what ggml's NEON kernels are written for (Graviton2+,
# Apple M1+, Ampere, Raspberry Pi 5's Cortex-A76); qemu-user emulates it with -cpu max
ARCH = "armv8.2-a+dotprod+fp16"
INSTALL = "apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user libc6-dev-arm64-cross"


def missing() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None] + ([] if SYSROOT.is_dir() else [str(SYSROOT)])


def build_ggml(src: Path, out: Path) -> Path:
    """ggml (base + CPU backend, static) from the patched llama.cpp tree `src`, for aarch64; cached in `out`
    (CMake rebuilds nothing that has not changed). Returns the build directory."""
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "CMakeCache.txt").exists():
        subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
                        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                        "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc", "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
                        "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={ARCH}",
                        "-DGGML_OPENMP=OFF", "-DGGML_BACKEND_DL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                        "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"], check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", str(out), "--target", "ggml", "ggml-base", "ggml-cpu", "-j", "2"],
                   check=True, capture_output=True, text=True)
    return out


def static_libs(build: Path) -> list[str]:
    found = {p.name: p for p in build.rglob("*.a")}
    return [str(found[name]) for name in ("libggml.a", "libggml-cpu.a", "libggml-base.a")]


def build_harness(src: Path, build: Path, source: Path, exe: Path) -> Path:
    subprocess.run(["aarch64-linux-gnu-g++", "-O2", "-x", "c", str(source), "-x", "none",
                    f"-I{src / 'ggml' / 'include'}", *static_libs(build), "-lm", "-lpthread", "-static",
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    return exe


def run(exe: Path, timeout: float) -> list[list[str]]:
    out = subprocess.run(["qemu-aarch64", "-cpu", "max", "-L", str(SYSROOT), str(exe)], check=True,
                         capture_output=True, text=True, timeout=timeout).stdout
    return [line.split() for line in out.splitlines() if line.strip()]
