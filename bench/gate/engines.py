"""The engines compared side by side, as command lines over the same model and resources.

skippy: `skippy serve` (the scheduler). single-lane: the same server with a ceiling of one
session (`--n-seq-max 1`): the old engine. llama-server: built from the same pinned tree by
`skippy build --tools`, with N slots over one unified KV pool (`-np N -kvu`). All get the same
threads, context size (the whole shared pool: skippy `--n-ctx`, llama-server `-c`, which
`-kvu` shares among slots) and step budget (`n_batch`, which skippy also uses as n_ubatch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs

from .model import ModelSpec

ENGINES = ("skippy", "single-lane", "llama-server")
NEW, OLD, PEER = ENGINES  # the gate's names for them


@attrs.frozen
class ServerConfig:
    """What every engine of a sweep shares."""

    model: ModelSpec
    threads: int = 2
    n_ctx: int = 4096
    n_batch: int = 512
    skippy_extra: tuple[str, ...] = ()  # appended to both skippy command lines (e.g. --no-prefix-cache)
    llama_server_extra: tuple[str, ...] = ()  # appended to llama-server's (e.g. --cache-ram 0)


def tools_dir(build: bool = True, progress: bool = False) -> Path:
    """Where llama-server and llama-batched-bench are (built first if missing and `build`: the
    first time takes minutes)."""
    from skippy.native._build import ensure_built, locate

    if build:
        return ensure_built(tools=True, progress=progress).lib_dir
    return locate().lib_dir


def server_argv(engine: str, cfg: ServerConfig, port: int | str, slots: int | str, tools: Path) -> list[str]:
    """The command line of `engine` on 127.0.0.1:`port`; `slots` is llama-server's -np (a
    placeholder string where the argv is only recorded)."""
    if engine in (NEW, OLD):
        argv = [sys.executable, "-m", "skippy", "serve", *cfg.model.skippy_args(), "--host", "127.0.0.1",
                "--port", str(port), "--threads", str(cfg.threads), "--n-ctx", str(cfg.n_ctx),
                "--n-batch", str(cfg.n_batch), "--shutdown-deadline", "2"]
        return argv + list(cfg.skippy_extra) + (["--n-seq-max", "1"] if engine == OLD else [])
    if engine == PEER:
        return [str(tools / "llama-server"), "-m", str(cfg.model.path), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(cfg.n_ctx), "-np", str(slots), "-kvu", "-t", str(cfg.threads), "-tb", str(cfg.threads),
                "-b", str(cfg.n_batch), "-ub", str(cfg.n_batch), "--no-webui", *cfg.llama_server_extra]
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
