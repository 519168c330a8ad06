"""skippy.models.synth writes reproducible, well-formed GGUF files (no native library needed)."""

from __future__ import annotations

import pathlib

import gguf
import pytest

from skippy.models.synth import FAMILIES, write_synthetic


def test_same_seed_gives_identical_bytes(tmp_path: pathlib.Path) -> None:
    for family in FAMILIES:
        first = write_synthetic(family, tmp_path / f"{family}-a.gguf", seed=7)
        second = write_synthetic(family, tmp_path / f"{family}-b.gguf", seed=7)
        assert first.read_bytes() == second.read_bytes(), family


def test_different_seed_gives_different_bytes(tmp_path: pathlib.Path) -> None:
    for family in FAMILIES:
        zero = write_synthetic(family, tmp_path / f"{family}-0.gguf", seed=0)
        one = write_synthetic(family, tmp_path / f"{family}-1.gguf", seed=1)
        assert zero.read_bytes() != one.read_bytes(), family


def test_file_reads_back_with_its_architecture(tmp_path: pathlib.Path) -> None:
    for family in FAMILIES:
        path = write_synthetic(family, str(tmp_path / f"{family}.gguf"))
        assert path == tmp_path / f"{family}.gguf"
        reader = gguf.GGUFReader(path)
        assert reader.fields["general.architecture"].contents() == family
        assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
        assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 512
        assert reader.fields[f"{family}.context_length"].contents() == 4096
        names = {tensor.name for tensor in reader.tensors}
        assert "token_embd.weight" in names
        assert ("output.weight" in names) == (family != "gemma2")  # gemma2 ties embeddings


def test_overwrite_leaves_no_temp_files(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "model.gguf"
    write_synthetic("llama", target, seed=1)
    write_synthetic("llama", target, seed=2)
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]


def test_unknown_family_raises_naming_valid_ones(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError) as excinfo:
        write_synthetic("gpt2", tmp_path / "nope.gguf")
    for family in FAMILIES:
        assert family in str(excinfo.value)
    assert list(tmp_path.iterdir()) == []
