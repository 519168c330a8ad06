"""cffi API-mode builder (argon2-cffi-bindings layout): cdef + C source -> one extension module."""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

from ._cdef import C_SOURCE, CDEF

MODULE_NAME = "_skippy_llama"


def make_ffi(include_dirs: list[Path], lib_dir: Path) -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source(
        MODULE_NAME,
        C_SOURCE,
        include_dirs=[str(p) for p in include_dirs],
        library_dirs=[str(lib_dir)],
        libraries=["llama"],
        extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        extra_compile_args=["-O2"],
    )
    return ffi
