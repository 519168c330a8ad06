"""GPU offload as an option: n_gpu_layers reaches llama_model_params, a CPU-only build accepts it
and runs every layer on the CPU with the same tokens, and an engine with layers on a GPU reports
the self-check's verdict instead of assuming batch invariance. The CUDA test needs a device."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio
from loguru import logger

import skippy
from skippy._cache import cache_root
from skippy._generate import generate_tokens
from skippy.native import Context, ContextOptions, Model, _devices, _lib
from skippy.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.native
OPTIONS = ContextOptions(n_ctx=256, n_batch=32, n_ubatch=32, n_seq_max=1, threads=1, batch_invariant=True)


def _tokens(path: Path, n_gpu_layers: int) -> list[int]:
    with Model(path, repack=False, n_gpu_layers=n_gpu_layers) as model, Context(model, OPTIONS) as ctx:
        prompt = np.arange(300, 320, dtype=np.int32)
        return list(generate_tokens(ctx, prompt, 16, Sampler(SamplingParams()), stop_at_eog=False))


class _Recording:
    """The real library, with the n_gpu_layers of every llama_model_params it loads a model with."""

    def __init__(self, lib) -> None:
        self._lib = lib
        self.seen: list[int] = []

    def llama_model_load_from_file(self, path, params):
        self.seen.append(params.n_gpu_layers)
        return self._lib.llama_model_load_from_file(path, params)

    def __getattr__(self, name: str):
        return getattr(self._lib, name)


async def test_the_engine_option_reaches_llama_model_params(synth_model_path, monkeypatch):
    ffi, lib = _lib.load()
    recording = _Recording(lib)
    monkeypatch.setattr(_lib, "load", lambda flags=None: (ffi, recording))
    with trio.fail_after(60):
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=256, threads=1, n_gpu_layers=7) as engine:
            assert engine.runtime.model.n_gpu_layers == 7
    assert recording.seen == [7]


def test_n_gpu_layers_must_be_an_integer(synth_model_path):
    with pytest.raises(skippy.errors.InvalidInputError, match="n_gpu_layers"):
        Model(synth_model_path("llama"), n_gpu_layers=1.5)


@pytest.mark.skipif("_devices.gpu_offload_supported()", reason="this build has a GPU: layers really move")
@pytest.mark.parametrize("family", ["llama", "gemma2", "falcon-h1"])
def test_a_cpu_build_runs_offloaded_layers_on_the_cpu_with_the_same_tokens(synth_model_path, family):
    path = synth_model_path(family)
    assert not _devices.offloads(99) and not _devices.offloads(-1)
    solo = _tokens(path, 0)
    assert _tokens(path, 99) == solo
    assert _tokens(path, -1) == solo  # negative: all layers


@pytest.fixture
def check_cache(tmp_path, monkeypatch):
    real = cache_root()
    for name in ("native", "models"):
        (tmp_path / name).symlink_to(real / name, target_is_directory=True)
    monkeypatch.setenv("SKIPPY_CACHE", str(tmp_path))
    return tmp_path / "checks"


async def test_with_layers_on_a_gpu_the_engine_reports_the_verdict(synth_model_path, check_cache, monkeypatch):
    """The engine's side of offload, with the device simulated (the layers still run on this CPU):
    the default "cached" mode runs the self-check rather than assume, its verdict is
    Engine.invariance, it is stored under its own key (a CPU verdict is not reused), and a warning
    says invariance is not guaranteed."""
    monkeypatch.setattr(_devices, "gpu_offload_supported", lambda: True)
    warnings: list[str] = []
    logger.enable("skippy")  # the library is silent until its user enables it
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        with trio.fail_after(120):
            async with skippy.open_engine(synth_model_path("llama"), n_ctx=256, threads=1, n_gpu_layers=99) as engine:
                verdict = engine.invariance
            async with skippy.open_engine(synth_model_path("llama"), n_ctx=256, threads=1) as engine:
                on_cpu = engine.invariance
    finally:
        logger.remove(sink)
        logger.disable("skippy")
    assert verdict is not None and verdict.identical and not verdict.cached
    assert on_cpu is None, "a CPU engine under 'cached' found no verdict: the GPU one is stored apart"
    assert any("not made batch-invariant" in w for w in warnings)
    assert any("not guaranteed" in w for w in warnings)


def _cuda_device() -> bool:
    return Path("/dev/nvidia0").exists() or (shutil.which("nvidia-smi") is not None and
                                            subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0)


@pytest.mark.skipif(not _cuda_device(), reason="no CUDA device")
def test_cuda_build_offloads_and_reports_a_verdict(synth_model_path, check_cache):
    """`skippy build --cuda` (its own cache entry; the first build takes many minutes), then an engine
    with every layer on the GPU: llama.cpp says it offloaded them and the engine holds a verdict."""
    env = {**os.environ, "SKIPPY_CUDA": "1", "SKIPPY_LLAMA_LOG": "INFO"}  # SKIPPY_CACHE: check_cache's
    build = subprocess.run([sys.executable, "-m", "skippy", "build", "--cuda", "--quiet"], env=env,
                           capture_output=True, text=True, timeout=3600, check=False)
    assert build.returncode == 0, build.stderr
    script = (
        "import trio, skippy\n"
        "from loguru import logger\n"
        "logger.enable('skippy')\n"
        "from skippy.native._devices import gpu_offload_supported\n"
        "async def main():\n"
        f"    async with skippy.open_engine({str(synth_model_path('llama'))!r}, n_ctx=256, n_gpu_layers=-1) as e:\n"
        "        toks = [ev.token async for ev in e.generate([1, 300, 301], max_tokens=8, ignore_eos=True)]\n"
        "        print('supported', gpu_offload_supported(), 'tokens', len([t for t in toks if t is not None]),\n"
        "              'verdict', e.invariance is not None)\n"
        "trio.run(main)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert "supported True tokens 8 verdict True" in run.stdout
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", run.stderr)
    assert offloaded and offloaded[1] == offloaded[2] != "0", run.stderr[-2000:]


@pytest.mark.parametrize("command", ["serve", "demo", "generate", "plan", "check"])
def test_every_model_command_takes_n_gpu_layers(command):
    from skippy.cli import _parser, _serve_config

    extra = ["hi"] if command == "generate" else []
    args = _parser().parse_args([command, *extra, "--family", "llama", "--n-gpu-layers", "-1"])
    assert args.n_gpu_layers == -1
    assert _parser().parse_args([command, *extra, "--family", "llama"]).n_gpu_layers == 0
    if command == "serve":
        assert _serve_config(args)["n_gpu_layers"] == -1


def test_plan_with_n_gpu_layers_on_a_cpu_build(native_build):
    import json

    runs = [subprocess.run([sys.executable, "-m", "skippy", "plan", "--family", "granite", "--json", *extra],
                           capture_output=True, text=True, timeout=60, check=False)
            for extra in ([], ["--n-gpu-layers", "99"])]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert json.loads(runs[0].stdout) == json.loads(runs[1].stdout)
