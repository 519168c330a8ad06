"""staged._layout reads a hybrid model's attention layers from its GGUF, as llama.cpp does, so a
pipeline cuts it only after a full-attention layer whatever its interval (no native code)."""

from __future__ import annotations

import pathlib

import attrs
import gguf
import pytest

from skippy.models.synth import TINY, write_sized
from skippy.staged._layout import LLAMA_CPP_DEFAULT_INTERVAL, file_boundary_rule, recurrent_layers
from skippy.staged._splits import SplitError, balanced_split, boundary_rule


def _header_only(path: pathlib.Path, arch: str, n_layer: int, **keys) -> pathlib.Path:
    """A GGUF with metadata only: what the layout reader looks at."""
    w = gguf.GGUFWriter(None, arch)
    w.add_uint32(f"{arch}.block_count", n_layer)
    for key, value in keys.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_interval_comes_from_the_file(tmp_path):
    """A synthetic qwen3next with interval 3 (the synth default is 2, llama.cpp's 4)."""
    path = write_sized("qwen3next", tmp_path / "q3.gguf", 6, attrs.evolve(TINY, extra={"full_attention_interval": 3}))
    assert recurrent_layers(path) == (True, True, False, True, True, False)
    rule = file_boundary_rule(path, "qwen3next")
    assert [b for b in range(1, 6) if rule(b)] == [3]
    assert balanced_split([1] * 6, 0, 2, allowed=rule) == [(0, 3), (3, 6)]


def test_a_file_without_the_key_gets_llama_cpp_s_default(tmp_path):
    path = _header_only(tmp_path / "q.gguf", "qwen3next", 8)
    assert LLAMA_CPP_DEFAULT_INTERVAL == 4
    assert recurrent_layers(path) == (True, True, True, False) * 2
    assert [b for b in range(1, 8) if file_boundary_rule(path, "qwen3next")(b)] == [4]


def test_listed_recurrent_layers_win_over_the_interval(tmp_path):
    flags = [True, False, True, True, False, False]
    path = _header_only(tmp_path / "q.gguf", "qwen3next", 6, full_attention_interval=2,
                        **{"attention.recurrent_layers": flags})
    assert recurrent_layers(path) == tuple(flags)
    assert [b for b in range(1, 6) if file_boundary_rule(path, "qwen3next")(b)] == [2, 5]


def test_an_interval_of_zero_is_refused(tmp_path):
    path = _header_only(tmp_path / "q.gguf", "qwen3next", 4, full_attention_interval=0)
    with pytest.raises(SplitError, match="full_attention_interval"):
        recurrent_layers(path)


def test_other_families_have_no_layout_and_cut_anywhere(tmp_path):
    path = write_sized("llama", tmp_path / "l.gguf", 4, TINY)
    assert recurrent_layers(path) is None
    rule = file_boundary_rule(path, "llama")
    assert all(rule(b) for b in range(1, 4))
    assert boundary_rule("qwen3next", recurrent_layers=(True, False))(2) is True
