"""skippy.native._gguf_check walks a GGUF without gguf-py's per-element views: it must find what
gguf-py's GGUFReader finds (every tensor's end byte, the architecture) and refuse what it refuses."""

from __future__ import annotations

import mmap

import pytest
from gguf import GGUFReader

from skippy.errors import ModelLoadError
from skippy.models.synth import FAMILIES
from skippy.native._gguf_check import _walk, check_gguf


def _reference(path) -> tuple[str, dict[bytes, int]]:
    reader = GGUFReader(str(path))
    field = reader.fields["general.architecture"]
    ends = {t.name.encode(): int(t.data_offset) + int(t.n_bytes) for t in reader.tensors}
    return bytes(field.parts[field.data[0]]).decode(), ends


@pytest.mark.parametrize("family", FAMILIES)
def test_the_walk_finds_what_gguf_py_finds(family, synth_model_path):
    path = synth_model_path(family)
    arch, ends = _reference(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        walked_arch, extents = _walk(buf)
    assert (walked_arch, dict(extents)) == (arch, ends) and len(extents) == len(ends) > 0
    assert check_gguf(path) == arch


@pytest.mark.parametrize("cut", [24, 200, 0.3, 0.999])
def test_a_cut_file_is_refused_by_name(cut, tmp_path, synth_model_path):
    data = synth_model_path("gemma2").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: cut if isinstance(cut, int) else int(len(data) * cut)])
    with pytest.raises(ModelLoadError, match="truncated|malformed"):
        check_gguf(path)


def test_an_impossible_count_is_refused_not_walked(tmp_path, synth_model_path):
    data = bytearray(synth_model_path("llama").read_bytes())
    data[16:24] = (2**62).to_bytes(8, "little")  # n_kv
    path = tmp_path / "count.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="malformed or truncated"):
        check_gguf(path)
