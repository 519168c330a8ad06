"""Reject bad model files in Python: llama.cpp mmaps the file and can crash on a truncated one."""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import ModelLoadError
from ._gguf_header import MalformedGguf, read_header

_MAGIC = b"GGUF"


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
        header = read_header(path)
    except MalformedGguf as exc:
        raise ModelLoadError(f"malformed or truncated GGUF {path}: {exc}") from None
    for tensor in header.tensors:
        end = tensor.offset + tensor.n_bytes
        if end > size:
            raise ModelLoadError(f"truncated GGUF {path}: tensor {tensor.name} ends at byte {end}, file has {size}")
    arch = header.fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"GGUF without general.architecture: {path}")
    return arch
