"""Quantizing a synthetic GGUF the way users run models: llama.cpp's own quantizer, in a child process.

Why a child: `llama_model_quantize` is called through ctypes on the patched build's libllama
(the tree has no `llama-quantize` binary), so a struct that ever drifts from the pin's llama.h
crashes a throwaway process, not the caller, and llama.cpp's log stays out of the caller's
stderr. Q8_0 needs no native code: `gguf.quants` writes it (see synth); K-quants need this.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

from ..errors import ModelLoadError

# llama_ftype values of include/llama.h at the pin
FTYPES: dict[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32,
}
TIMEOUT_S = 900.0


class _Params(ctypes.Structure):
    """struct llama_model_quantize_params of the pinned include/llama.h, field for field."""

    _fields_ = [
        ("nthread", ctypes.c_int32),
        ("ftype", ctypes.c_int),
        ("output_tensor_type", ctypes.c_int),
        ("token_embedding_type", ctypes.c_int),
        ("allow_requantize", ctypes.c_bool),
        ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool),
        ("pure", ctypes.c_bool),
        ("keep_split", ctypes.c_bool),
        ("dry_run", ctypes.c_bool),
        ("imatrix", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("tt_overrides", ctypes.c_void_p),
        ("prune_layers", ctypes.c_void_p),
        ("max_buf_size", ctypes.c_size_t),
    ]


def _libllama() -> Path | None:
    """The patched build's libllama, or None when skippy's native layer is not built."""
    try:
        from ..native._build import locate

        lib = locate().lib_dir / "libllama.so"
    except (ImportError, OSError, ValueError):  # no build configuration: the caller falls back to Q8_0
        return None
    return lib if lib.exists() else None


def native_quantizer_available() -> bool:
    return _libllama() is not None


def quantize(src: Path, dst: Path, quant: str, threads: int | None = None, requantize: bool = False) -> None:
    """Quantize `src` (F32 GGUF) into `dst` with llama.cpp's mixture for `quant` (e.g. Q4_K_M);
    `requantize`: `src` may be quantized already (llama.cpp dequantizes it first: how the prefill
    benchmark makes an F16 copy of a Q4_1 model)."""
    if quant not in FTYPES:
        raise ModelLoadError(f"unknown quantization {quant!r}; known: {', '.join(FTYPES)}")
    if _libllama() is None:
        raise ModelLoadError(f"{quant} needs skippy's native build (libllama); run `skippy build`")
    argv = [sys.executable, "-m", "skippy.models._quantize", str(src), str(dst), quant,
            str(threads or os.cpu_count() or 1), "1" if requantize else "0"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ModelLoadError(f"quantizing {src.name} to {quant} took over {TIMEOUT_S:g} s") from exc
    if done.returncode != 0 or not dst.exists():
        raise ModelLoadError(f"quantizing {src.name} to {quant} failed (exit {done.returncode}):\n"
                             f"{done.stderr[-2000:]}")


def _main(src: str, dst: str, quant: str, threads: str, requantize: str = "0") -> int:
    lib_path = _libllama()
    assert lib_path is not None
    lib = ctypes.CDLL(str(lib_path))
    lib.llama_model_quantize_default_params.restype = _Params
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_Params)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_backend_init()
    params = lib.llama_model_quantize_default_params()
    params.nthread = int(threads)
    params.ftype = FTYPES[quant]
    params.allow_requantize = requantize == "1"
    return int(lib.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:6]))
