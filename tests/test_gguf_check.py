"""skippy.native._gguf_header walks a GGUF without gguf-py's per-element views: it must find what
gguf-py's GGUFReader finds (every tensor's place, size and element count, the scalar and short
fields) and check_gguf must refuse what was refused before."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from skippy.errors import ModelLoadError
from skippy.models.synth import FAMILIES
from skippy.native._gguf_check import check_gguf
from skippy.native._gguf_header import KEEP_ARRAY, read_header


@pytest.mark.parametrize("family", FAMILIES)
def test_the_walk_finds_what_gguf_py_finds(family, synth_model_path):
    path = synth_model_path(family)
    reader, header = GGUFReader(str(path)), read_header(path)
    assert [(t.name, t.offset, t.n_bytes, t.n_elements) for t in header.tensors] == [
        (t.name, int(t.data_offset), int(t.n_bytes), int(t.n_elements)) for t in reader.tensors]
    kept = 0
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # gguf-py's pseudo-fields (version, counts)
        value = field.contents()
        if isinstance(value, list) and (len(value) > KEEP_ARRAY or any(isinstance(v, str) for v in value)):
            assert key not in header.fields  # stepped over
            continue
        got = header.fields[key]
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key
        kept += 1
    assert kept > 5 and check_gguf(path) == header.fields["general.architecture"]


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
