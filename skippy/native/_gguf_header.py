"""A GGUF's metadata and tensor table, read without its arrays' contents.

gguf-py's GGUFReader builds a numpy view per array element: on Gemma-3's 262k-token vocabulary that
took 20-40 s per file on a 2-core box, most of a test's time and of `skippy serve`'s start (cProfile
on tests/native/_fa_logits.py: 42 of 56 s in gguf_reader._get_field_parts). This walk keeps scalars
and short numeric arrays, steps over the rest, and computes each tensor's size with gguf-py's table
of quant block sizes: 0.12 s for Gemma-3."""

from __future__ import annotations

import math
import mmap
import os
import struct

import attrs

# value types: struct format by type id; 8 is a string, 9 an array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
KEEP_ARRAY = 4096  # numeric arrays up to this many elements are read (per-layer lists); longer ones are skipped
DEFAULT_ALIGNMENT = 32


class MalformedGguf(Exception):
    """The file ends, or says something impossible, before the walk is done."""


@attrs.frozen
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


@attrs.frozen
class GgufHeader:
    version: int
    fields: dict[str, object]  # scalars, strings (str) and short numeric arrays (list); longer arrays absent
    tensors: tuple[TensorInfo, ...]


class _Walk:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise MalformedGguf(f"needs {n} bytes at offset {start}, file has {self.size}")
        self.pos = start + n
        return start

    def scalar(self, fmt: str) -> object:
        return struct.unpack_from("<" + fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        start = self.take(n)
        return bytes(self.buf[start:start + n]).decode("utf-8", "replace")

    def value(self, vtype: int) -> object:
        """The value, or None for an array stepped over."""
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise MalformedGguf(f"unknown value type {vtype}")
        etype, count = self.scalar("I"), self.scalar("Q")
        if etype in _SCALAR:
            fmt = _SCALAR[etype]
            start = self.take(count * struct.calcsize(fmt))
            return list(struct.unpack_from(f"<{count}{fmt}", self.buf, start)) if count <= KEEP_ARRAY else None
        if etype == _STRING:
            for _ in range(count):
                self.take(self.scalar("Q"))
            return None
        if etype == _ARRAY:
            for _ in range(count):
                self.value(_ARRAY)
            return None
        raise MalformedGguf(f"array of unknown value type {etype}")


def _n_bytes(name: str, ggml_type: int, dims: list[int]) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise MalformedGguf(f"tensor {name} has unknown type {ggml_type}") from None
    if dims and dims[0] % block:
        raise MalformedGguf(f"tensor {name}: a row of {dims[0]} is not a multiple of its block {block}")
    return math.prod(dims) // block * type_size


def walk(buf: mmap.mmap) -> GgufHeader:
    w = _Walk(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise MalformedGguf("bad magic")
    w.take(4)
    version, n_tensors, n_kv = w.scalar("I"), w.scalar("Q"), w.scalar("Q")
    fields: dict[str, object] = {}
    for _ in range(n_kv):
        key = w.string()
        value = w.value(w.scalar("I"))
        if value is not None:
            fields[key] = value
    raw = []
    for _ in range(n_tensors):
        name = w.string()
        n_dims = w.scalar("I")
        if n_dims > 8:
            raise MalformedGguf(f"tensor {name} has {n_dims} dimensions")
        dims = [w.scalar("Q") for _ in range(n_dims)]
        ggml_type, offset = w.scalar("I"), w.scalar("Q")
        raw.append((name, tuple(dims), ggml_type, offset, _n_bytes(name, ggml_type, dims)))
    alignment = fields.get("general.alignment")
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else DEFAULT_ALIGNMENT
    start = -(-w.pos // alignment) * alignment
    return GgufHeader(version, fields, tuple(TensorInfo(n, d, t, start + o, b) for n, d, t, o, b in raw))


def read_header(path: os.PathLike[str] | str) -> GgufHeader:
    """Raises MalformedGguf (or OSError) where the file cannot be walked."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise MalformedGguf("empty file")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return walk(buf)
