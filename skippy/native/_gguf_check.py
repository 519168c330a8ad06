"""Reject bad model files in Python: llama.cpp mmaps the file and can crash on a truncated one."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ..errors import ModelLoadError

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

    from gguf import GGUFReader

    try:
        reader = GGUFReader(os.fspath(path))
    except Exception as exc:  # the reader raises whatever numpy raises on garbage
        raise ModelLoadError(f"malformed or truncated GGUF {path}: {exc}") from exc
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise ModelLoadError(
                f"truncated GGUF {path}: tensor {tensor.name} ends at byte {end}, file has {size}"
            )
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ModelLoadError(f"GGUF without general.architecture: {path}")
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
