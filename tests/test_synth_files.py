"""skippy.models.synth writes reproducible, well-formed GGUF files (no native library needed)."""

from __future__ import annotations

import hashlib
import pathlib

import gguf
import numpy as np
import pytest

from skippy.models.synth import FAMILIES, GENERATOR_VERSION, REFUSED_FAMILIES, write_synthetic


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


# sha256 of each family's tiny file (seed 0, not deep) at GENERATOR_VERSION 1, written with gguf
# 0.19.0 (pinned in pyproject) and numpy 2.x: adding a family or a size must not move these bytes
# (the model cache and recorded results key on them); a deliberate change bumps GENERATOR_VERSION.
PINNED_SHA256 = {
    "llama": "dfb5ce397f316052536be5d8740e57c050a66f569ce7d361a6e8046e43e8204f",
    "gemma2": "43ad0e5e07210eb434004660d757bc4a9bbc5a1a2fb42370e1a21f46eddcccdc",
    "deepseek2": "006f9b4ba74dd802c69fb4a360a1c759628c4101809a891b8ecc5ff924ccd0ab",
    "falcon-h1": "7b0a6b3cff41babb88ca35ddf7f7f8496c0886c5b3473f252748b1bc6aa16bf6",
    "qwen3next": "ab277cfcba623879ff7c69bb7e4dbfb971d9b59f5ba6c750313e8942802df9b8",
    "qwen2": "aed5251a8891b709780f52e3f7b18a75968483ed89e9c103bea58e1584816131",
    "qwen3": "19b72f6b685f9e43df38b0dd50314b85f9f33ff966de3c9c33e9a62d34b3a692",
    "qwen3moe": "adc50e10d5fb9ba4fe3cd8153f86e009f963b75312987919502035a20981c702",
    "phi3": "ad61d3700dbd3f5b45f4a982f10221ab21c6a3140e5f9a99f10d0336d6d073e3",
    "mamba2": "40880c43fa103c77a5af1b7d698e978f6ee505585868a78f527383c33c538a73",
    "granite": "6960a15e24dea479042133be3bbed273c812766be69c1ae4c86e43cbdd0c1c8f",
    "olmo2": "030e3aee35a39c735dde0cc1175c3da756c3a2182230b23241e0ac5bc6bf0ed6",
    "starcoder2": "f82fd6e3b1993669bc37f60c83ee68871ad5e9f864dca183ddddda60aebe226a",
    "gpt-oss": "9ace312b8584e7db1ae9924303e5b90c7bcdb64dd45bcf192c69024d2c2a83fc",
    "llada": "ea6b176874a6018f311e16d38859257aaed7feb28444c98083533bfd85d14992",
}


@pytest.mark.skipif(not np.__version__.startswith("2."), reason="pins were written with numpy 2.x")
@pytest.mark.parametrize("family", list(PINNED_SHA256))
def test_tiny_files_keep_their_pinned_bytes(tmp_path: pathlib.Path, family: str) -> None:
    assert GENERATOR_VERSION == 1, "new generator version: re-pin every family"
    path = write_synthetic(family, tmp_path / f"{family}.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == PINNED_SHA256[family]


def test_every_family_is_pinned() -> None:
    assert set(PINNED_SHA256) == set(FAMILIES) | set(REFUSED_FAMILIES)
