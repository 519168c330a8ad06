"""Build and run the C/C++ kernel harnesses of the native tests against the native build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import pytest

C_FLAGS = ("-O2",)
GGML_LIBS = ("-lggml", "-lggml-base", "-lggml-cpu", "-lm")


def build_harness(build, source: Path, out_dir: Path, flags: Sequence[str], libs: Sequence[str] = GGML_LIBS,
                  compilers: Sequence[str] = ("cc", "gcc")) -> Path:
    """Compile `source` with `flags`, linked to the build's libraries with an rpath."""
    compiler = next((found for name in compilers if (found := shutil.which(name))), None)
    if compiler is None:
        pytest.fail(f"a compiler ({' or '.join(compilers)}) is needed to build {source.name} (the native build needs one too)")
    exe = out_dir / source.stem
    lib = build.lib_dir
    subprocess.run([compiler, *flags, str(source), f"-L{lib}", *libs, f"-Wl,-rpath,{lib}", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def public_api_flags(build) -> list[str]:
    """A harness that uses only ggml's public headers."""
    return [*C_FLAGS, f"-I{build.src / 'ggml' / 'include'}"]


def run_harness(exe: Path, env: dict[str, str] | None = None, timeout: float = 300) -> list[list[str]]:
    """The harness's output lines, split into fields."""
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=timeout, env=env).stdout
    return [line.split() for line in out.splitlines() if line.strip()]
