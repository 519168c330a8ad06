"""Reject bad model files in Python: llama.cpp mmaps the file and can crash on a truncated one.

The walk reads only what the checks need (the metadata keys, the tensor infos) and steps over
every array without building it. gguf-py's GGUFReader builds a numpy view per array element: on
Gemma-3's 262k-token vocabulary that took 20-40 s per load on a 2-core box, most of a test's time
and of `skippy serve`'s start (profiled with cProfile on tests/native/_fa_logits.py)."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from ..errors import ModelLoadError

_MAGIC = b"GGUF"
_ALIGNMENT_KEY = "general.alignment"
_DEFAULT_ALIGNMENT = 32
# GGUF value types: fixed sizes by type id; 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Malformed(Exception):
    """The file ends, or says something impossible, before the walk is done."""


class _Walk:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _Malformed(f"needs {n} bytes at offset {start}, file has {self.size}")
        self.pos = start + n
        return start

    def u32(self) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8))[0]

    def string(self) -> bytes:
        n = self.u64()
        start = self.take(n)
        return self.buf[start:start + n]

    def value(self, vtype: int, keep: bool) -> object:
        """A value when `keep` (strings and integers only), else steps over it."""
        if vtype in _FIXED:
            start = self.take(_FIXED[vtype])
            if keep and vtype in (4, 10):
                return struct.unpack_from("<I" if vtype == 4 else "<Q", self.buf, start)[0]
            return None
        if vtype == _STRING:
            s = self.string()
            return s if keep else None
        if vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in _FIXED:
                self.take(count * _FIXED[etype])
            elif etype == _STRING:
                for _ in range(count):
                    self.take(self.u64())
            elif etype == _ARRAY:
                for _ in range(count):
                    self.value(_ARRAY, False)
            else:
                raise _Malformed(f"array of unknown value type {etype}")
            return None
        raise _Malformed(f"unknown value type {vtype}")


def _tensor_bytes(ggml_type: int, dims: list[int], name: bytes) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise _Malformed(f"tensor {name.decode('utf-8', 'replace')} has unknown type {ggml_type}") from None
    n = 1
    for d in dims:
        n *= d
    if dims and dims[0] % block:
        raise _Malformed(f"tensor {name.decode('utf-8', 'replace')}: row of {dims[0]} not a multiple of {block}")
    return n // block * type_size


def _walk(buf: mmap.mmap) -> tuple[str | None, list[tuple[bytes, int]]]:
    """(general.architecture, [(tensor name, end byte)]) of a GGUF whose 8-byte head was checked."""
    w = _Walk(buf)
    w.take(8)
    n_tensors, n_kv = w.u64(), w.u64()
    arch, alignment = None, _DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = w.string()
        vtype = w.u32()
        wanted = key in (b"general.architecture", _ALIGNMENT_KEY.encode())
        value = w.value(vtype, wanted)
        if key == b"general.architecture" and isinstance(value, bytes):
            arch = value.decode("utf-8", "replace")
        elif key == _ALIGNMENT_KEY.encode() and isinstance(value, int) and value > 0:
            alignment = value
    infos = []
    for _ in range(n_tensors):
        name = w.string()
        n_dims = w.u32()
        if n_dims > 8:
            raise _Malformed(f"tensor {name.decode('utf-8', 'replace')} has {n_dims} dimensions")
        dims = [w.u64() for _ in range(n_dims)]
        ggml_type, offset = w.u32(), w.u64()
        infos.append((name, offset, _tensor_bytes(ggml_type, dims, name)))
    data_start = -(-w.pos // alignment) * alignment
    return arch, [(name, data_start + offset + n_bytes) for name, offset, n_bytes in infos]


def check_gguf(path: Path) -> str:
    """Validate header, metadata and tensor extents; return general.architecture."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {path}")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8 or head[:4] != _MAGIC:
            raise ModelLoadError(f"not a GGUF file (bad magic): {path}")
        (version,) = struct.unpack("<I", head[4:8])
        if version not in (2, 3):
            raise ModelLoadError(f"unsupported GGUF version {version}: {path}")
        try:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                arch, extents = _walk(buf)
        except _Malformed as exc:
            raise ModelLoadError(f"malformed or truncated GGUF {path}: {exc}") from None
    for name, end in extents:
        if end > size:
            raise ModelLoadError(f"truncated GGUF {path}: tensor {name.decode('utf-8', 'replace')} ends at byte "
                                 f"{end}, file has {size}")
    if arch is None:
        raise ModelLoadError(f"GGUF without general.architecture: {path}")
    return arch
