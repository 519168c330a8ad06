"""Whether the loaded native build can put layers on a GPU: asked of libllama itself.

Why: `n_gpu_layers` is a request; llama.cpp honours it only when a GPU backend was built in
(`skippy build --cuda`) and found a device, and otherwise runs every layer on the CPU. Batch
invariance holds for the CPU kernels skippy patches, not for a GPU's, so the engine needs to
know which happened. `llama_supports_gpu_offload` is not in our cdef (changing that rebuilds
the extension), so it is called through cffi's ABI mode on the same libllama.so.
"""

from __future__ import annotations

import functools

from . import _lib
from ._build import locate


@functools.cache
def gpu_offload_supported() -> bool:
    """True when this build has a GPU backend with a device (or RPC) that layers can go to."""
    import cffi

    _lib.load()  # the library this process uses, its backends initialised
    ffi = cffi.FFI()
    ffi.cdef("bool llama_supports_gpu_offload(void);")
    lib = ffi.dlopen(str(locate().lib_dir / "libllama.so"))
    return bool(lib.llama_supports_gpu_offload())


def offloads(n_gpu_layers: int) -> bool:
    """Whether a model loaded with `n_gpu_layers` has layers on a GPU."""
    return n_gpu_layers != 0 and gpu_offload_supported()
