"""Build the patched llama.cpp and our cffi extension, cached by what changes the output.

Cache key = (pin, every patch's bytes, build flags). A second `ensure_built` with
the same key only reads a stamp file, so it returns in milliseconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import attrs
from loguru import logger

from .._cache import cache_root
from ..errors import NativeBuildError
from . import _source

EXT_MODULE = "_skippy_llama"
TOOL_TARGETS = ("llama-server", "llama-batched-bench")


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


@attrs.frozen
class BuildFlags:
    """Everything that changes the compiled bytes. Defaults come from SKIPPY_NATIVE / SKIPPY_CUDA."""

    native: bool = attrs.field(factory=lambda: _env_flag("SKIPPY_NATIVE", True))
    cuda: bool = attrs.field(factory=lambda: _env_flag("SKIPPY_CUDA", False))
    build_type: str = "Release"
    # Some x86 VMs advertise AMX in cpuid but trap on its instructions (SIGILL in ggml's
    # AMX Q4_1 kernel, seen on this project's machines), so -march=native must not pull it in.
    # GCC lets an explicit -mno-* win over what -march implies, whatever the order.
    no_amx: bool = True

    def cmake_args(self) -> list[str]:
        on = {True: "ON", False: "OFF"}
        extra = []
        if self.no_amx and platform.machine() in ("x86_64", "AMD64"):
            no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            extra = [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
        return [*extra,
            f"-DCMAKE_BUILD_TYPE={self.build_type}",
            "-DBUILD_SHARED_LIBS=ON",
            f"-DGGML_NATIVE={on[self.native]}",
            f"-DGGML_CUDA={on[self.cuda]}",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            # tools are configured so llama-server / llama-batched-bench can be built on request
            "-DLLAMA_BUILD_COMMON=ON",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF",
        ]


@attrs.frozen
class NativeBuild:
    """Paths of one finished build."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def lib_dir(self) -> Path:
        return self.build_dir / "bin"

    @property
    def ext_dir(self) -> Path:
        return self.root / "py"

    @property
    def stamp(self) -> Path:
        return self.root / "stamp.json"

    def tool(self, name: str) -> Path:
        return self.lib_dir / name

    def read_stamp(self) -> dict:
        try:
            return json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return {}


def build_key(flags: BuildFlags, patches: list[Path], pin: _source.Pin = _source.PIN) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({"pin": attrs.asdict(pin), "flags": attrs.asdict(flags)}, sort_keys=True).encode())
    for patch in patches:
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def dev_tree() -> Path | None:
    """SKIPPY_LLAMA_DEV_TREE: a directory with src/ (a llama.cpp tree you are editing) and
    build/ (its CMake build). Skippy builds it incrementally instead of the pinned cache entry:
    how patches are developed before they are written to patches/."""
    value = os.environ.get("SKIPPY_LLAMA_DEV_TREE")
    return Path(value).expanduser().resolve() if value else None


def locate(flags: BuildFlags | None = None) -> NativeBuild:
    """Where the build for these flags and the current patches lives (built or not)."""
    dev = dev_tree()
    if dev is not None:
        return NativeBuild(dev)
    flags = flags or BuildFlags()
    return NativeBuild(cache_root() / "native" / build_key(flags, _source.patch_files()))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_built(flags: BuildFlags | None = None, tools: bool = False, progress: bool = True) -> NativeBuild:
    """Fetch, patch, configure, compile and wrap; each stage is skipped when already done."""
    flags = flags or BuildFlags()
    build = locate(flags)
    if dev_tree() is not None:
        return _ensure_dev_built(build, tools, progress)
    if _complete(build, tools):
        return build
    with _locked(build.root.parent / f"{build.root.name}.lock"):
        if _complete(build, tools):  # another process finished it while we waited
            return build
        started = time.monotonic()
        stamp = build.read_stamp()
        if not stamp.get("lib"):
            _build_library(build, flags, progress)
            stamp = {"lib": True, "flags": attrs.asdict(flags), "patches": [p.name for p in _source.patch_files()]}
            _write_stamp(build, stamp)
        if stamp.get("ext") != extension_digest():
            _compile_extension(build)
            stamp["ext"] = extension_digest()
            _write_stamp(build, stamp)
        if tools and not stamp.get("tools"):
            _cmake_build(build, list(TOOL_TARGETS), progress, "llama-server + llama-batched-bench")
            stamp["tools"] = True
            _write_stamp(build, stamp)
        logger.info("native build {} ready in {:.1f}s", build.root.name, time.monotonic() - started)
    return build


def ensure_stock_tools(flags: BuildFlags | None = None, progress: bool = True) -> NativeBuild:
    """The pinned llama.cpp with none of our patches, tools only: the baseline the attention
    bench compares against. No extension: our cdef needs the patched API."""
    flags = flags or BuildFlags()
    build = NativeBuild(cache_root() / "native" / f"stock-{build_key(flags, [])}")
    if build.read_stamp().get("tools"):
        return build
    with _locked(build.root.parent / f"{build.root.name}.lock"):
        stamp = build.read_stamp()
        if not stamp.get("lib"):
            _build_library(build, flags, progress, patches=[])
            stamp = {"lib": True, "flags": attrs.asdict(flags), "patches": []}
            _write_stamp(build, stamp)
        if not stamp.get("tools"):
            _cmake_build(build, list(TOOL_TARGETS), progress, "stock llama-server + llama-batched-bench")
            stamp["tools"] = True
            _write_stamp(build, stamp)
    return build


def _ensure_dev_built(build: NativeBuild, tools: bool, progress: bool) -> NativeBuild:
    if not (build.src / "include" / "llama.h").exists() or not build.build_dir.is_dir():
        raise NativeBuildError(f"SKIPPY_LLAMA_DEV_TREE={build.root} needs src/ and a configured build/")
    targets = ["llama", *(TOOL_TARGETS if tools else ())]
    _cmake_build(build, targets, progress, "dev tree")  # incremental: seconds when nothing changed
    stamp = build.read_stamp()
    if stamp.get("ext") != extension_digest() or stamp.get("lib_mtime") != _lib_mtime(build):
        _compile_extension(build)
        _write_stamp(build, {"lib": True, "ext": extension_digest(), "lib_mtime": _lib_mtime(build), "dev": True})
    return build


def _lib_mtime(build: NativeBuild) -> float:
    return (build.lib_dir / "libllama.so").stat().st_mtime


def _complete(build: NativeBuild, tools: bool) -> bool:
    stamp = build.read_stamp()
    return bool(stamp.get("lib") and stamp.get("ext") == extension_digest() and (stamp.get("tools") or not tools))


def extension_digest() -> str:
    """The extension is rebuilt (alone, in seconds) whenever our cdef or C helpers change."""
    from ._cdef import C_SOURCE, CDEF

    return hashlib.sha256((CDEF + C_SOURCE).encode()).hexdigest()[:16]


def _write_stamp(build: NativeBuild, stamp: dict) -> None:
    tmp = build.stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True))
    os.replace(tmp, build.stamp)


def _build_library(build: NativeBuild, flags: BuildFlags, progress: bool, patches: list[Path] | None = None) -> None:
    build.root.mkdir(parents=True, exist_ok=True)
    sdist = _source.fetch_sdist(cache_root() / "downloads")
    logger.info("extracting llama.cpp {} into {}", _source.PIN.commit, build.src)
    _source.extract_vendor_tree(sdist, build.src)
    _source.apply_patches(build.src, _source.patch_files() if patches is None else patches)
    shutil.rmtree(build.build_dir, ignore_errors=True)
    _run_logged(
        ["cmake", "-S", str(build.src), "-B", str(build.build_dir), *flags.cmake_args()],
        build.root / "configure.log", "configure",
    )
    _cmake_build(build, ["llama"], progress, "libllama + ggml")


_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def _cmake_build(build: NativeBuild, targets: list[str], progress: bool, label: str) -> None:
    jobs = str(os.cpu_count() or 2)
    cmd = ["cmake", "--build", str(build.build_dir), "-j", jobs, "--target", *targets]
    log_path = build.root / "build.log"
    tail: deque[str] = deque(maxlen=40)
    bar = _progress_bar(label) if progress else None
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip())
            match = _PERCENT.match(line)
            if bar is not None and match:
                bar.n = int(match.group(1))
                bar.refresh()
        code = proc.wait()
    if bar is not None:
        if code == 0:
            bar.n = 100
        bar.close()
    if code != 0:
        raise NativeBuildError(f"building {label} failed (full log: {log_path}):\n" + "\n".join(tail))


def _progress_bar(label: str):
    from tqdm import tqdm

    return tqdm(total=100, desc=f"building {label}", unit="%", file=sys.stderr, bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}")


def _run_logged(cmd: list[str], log_path: Path, what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log_path.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise NativeBuildError(f"{what} failed (log: {log_path}):\n{proc.stderr[-3000:]}")


def _compile_extension(build: NativeBuild) -> None:
    """Compile the cffi API-mode module against the patched llama.h, linked with an rpath."""
    from ._ffi_build import make_ffi

    logger.info("compiling the cffi extension {}", EXT_MODULE)
    tmp = build.root / "py.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ffi = make_ffi(
        include_dirs=[build.src / "include", build.src / "ggml" / "include"],
        lib_dir=build.lib_dir,
    )
    try:
        ffi.compile(tmpdir=str(tmp), verbose=False)
    except Exception as exc:  # cffi raises distutils' errors, which have no common base worth naming
        raise NativeBuildError(f"compiling the cffi extension failed: {exc}") from exc
    shutil.rmtree(build.ext_dir, ignore_errors=True)
    os.replace(tmp, build.ext_dir)
