"""A sweep: every load x engine x workload, servers restarted per (load, engine), results on disk.

Engines are interleaved at each load (skippy, skippy-fast, single-lane, llama-server,
llama-server-stock at N=1, then at N=2, ...) so slow drift of a noisy machine hits them alike;
with `rounds` each load runs K rounds in alternating engine order, pooled per engine (rounds.py).
Each server is fresh for its load, so prefix caches start cold and its peak RSS belongs to that
load. results.json is rewritten after every run: an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import attrs
import httpx
from tqdm import tqdm

from .batched import run_batched_bench
from .engines import VLLM, VLLM_STARTUP_S, ServerConfig, Tools, server_argv, tools_for
from .metrics import Slo
from .model import read_vocab
from .peers import prepare_weights
from .procs import free_port, peak_rss_mb, running_server
from .records import Load, RunResult
from .report import write_results
from .rounds import merge_rounds, round_order
from .runner import RunConfig, run_one
from .workloads import Lengths, Workload


@attrs.frozen
class SweepOptions:
    out: Path
    server: ServerConfig
    run: RunConfig
    engines: tuple[str, ...]
    workloads: tuple[Workload, ...]
    lengths: Lengths
    concurrency: tuple[int, ...]
    rates: tuple[float, ...] = ()
    open_slots: int = 32  # llama-server -np under Poisson load
    slots: int | None = None  # llama-server -np at every load (an overload run); None: N, or open_slots
    slo: Slo = Slo()
    request_timeout: float = 600.0
    startup_timeout: float = 120.0
    batched_bench: bool = True
    progress: bool = True
    rounds: int = 1  # each engine's block repeated, engines alternating order (rounds.py), then pooled
    rounds_up_to: int | None = None  # only closed loads with N <= this get `rounds`; None: every load

    def rounds_at(self, load: Load) -> int:
        if self.rounds_up_to is None or (load.kind == "closed" and (load.n or 1) <= self.rounds_up_to):
            return max(1, self.rounds)
        return 1

    @property
    def loads(self) -> list[Load]:
        return [Load.closed(n) for n in self.concurrency] + [Load.poisson(r) for r in self.rates]


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def isa() -> str:
    """The widest SIMD the CPU has (what the kernels pick their path by): AVX-512, AVX2, NEON, or the machine."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    for name, flag in (("AVX-512", "avx512f"), ("AVX2", "avx2"), ("NEON", "asimd")):
        if f" {flag}" in flags:
            return name
    return platform.machine()


def meta(opts: SweepOptions, tools: Tools) -> dict[str, Any]:
    """Everything needed to reproduce or question the figures."""
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["python", "-m", "bench.gate", *sys.argv[1:]],
        "git_commit": _git_commit(),
        "host": {"node": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version(), "isa": isa()},
        "model": {"model": opts.server.model.model, "family": opts.server.model.family,
                  "path": str(opts.server.model.path), "bytes": opts.server.model.path.stat().st_size},
        "server": {"threads": opts.server.threads, "n_ctx": opts.server.n_ctx, "n_batch": opts.server.n_batch},
        "engines": list(opts.engines),
        "argv": {e: server_argv(e, opts.server, "PORT", opts.slots or "N", tools) for e in opts.engines},
        "tools": {"patched": str(tools.patched), "stock": None if tools.stock is None else str(tools.stock)},
        "workloads": [attrs.asdict(w) for w in opts.workloads],
        "lengths": attrs.asdict(opts.lengths),
        "loads": [attrs.asdict(load) for load in opts.loads],
        "open_slots": opts.open_slots,
        "slots": opts.slots,
        "run": attrs.asdict(opts.run),
        "slo": attrs.asdict(opts.slo),
        "request_timeout": opts.request_timeout,
        "rounds": opts.rounds,
        "rounds_up_to": opts.rounds_up_to,
    }


async def _batched(opts: SweepOptions, tools: Tools) -> list[dict[str, Any]]:
    batches = sorted(set(opts.concurrency)) or [1]
    shapes = sorted({(w.input_len, w.output_len) for w in opts.workloads})
    return [await run_batched_bench(tools.patched / "llama-batched-bench", opts.server, pp, tg, batches,
                                    opts.out / "logs" / f"batched-bench-pp{pp}-tg{tg}.log", opts.request_timeout)
            for pp, tg in shapes]


async def run_sweep(opts: SweepOptions) -> dict[str, Any]:
    """Run everything, write results.json / summary.md / plots under `opts.out`; return the results."""
    opts.out.mkdir(parents=True, exist_ok=True)
    tools = tools_for(opts.engines, opts.batched_bench, progress=opts.progress)
    if VLLM in opts.engines:  # installed beforehand (`peers install vllm`); its fp32 copy made once
        prepare_weights(opts.server.model.path)
    vocab = read_vocab(opts.server.model.path)
    results: dict[str, Any] = {"meta": meta(opts, tools), "runs": [], "batched_bench": []}
    runs: list[RunResult] = []
    if opts.batched_bench:
        results["batched_bench"] = await _batched(opts, tools)
    timeout = httpx.Timeout(opts.request_timeout, connect=30.0, pool=None)
    # idle connections are dropped well before a server's keep-alive timeout (5 s for llama-server's
    # httplib, and once for skippy's hypercorn), so a request never races the server closing its connection
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0)
    client_args = dict(timeout=timeout, limits=limits)
    for load in opts.loads:
        rounds = opts.rounds_at(load)
        done: dict[tuple[str, str], list[RunResult]] = {}

        def keep(run: RunResult) -> None:
            done.setdefault((run.engine, run.workload), []).append(run)
            write_results(opts.out, results, runs + [merge_rounds(v) for v in done.values()], opts.slo, final=False)

        for k in range(rounds):
            for engine in round_order(opts.engines, k):
                await _serve_engine(opts, tools, vocab, client_args, engine, load, k, rounds, keep)
        runs += [merge_rounds(v) for v in done.values()]
    write_results(opts.out, results, runs, opts.slo, final=True)
    return results


async def _serve_engine(opts: SweepOptions, tools: Tools, vocab: Any, client_args: dict[str, Any], engine: str,
                        load: Load, k: int, rounds: int, keep: Callable[[RunResult], None]) -> None:
    """One fresh server of `engine` for `load`: every workload's run on it (round k of `rounds`), each
    handed to `keep` as it ends, so an interrupted sweep keeps what it measured."""
    port = free_port()
    argv = server_argv(engine, opts.server, port, opts.slots or load.n or opts.open_slots, tools)
    tag = "" if rounds == 1 else f"-r{k + 1}"
    log = opts.out / "logs" / f"{engine}-{load.label.replace(' ', '').replace('/', '_')}{tag}.log"
    startup = max(opts.startup_timeout, VLLM_STARTUP_S) if engine == VLLM else opts.startup_timeout
    async with running_server(argv, port, log, startup_timeout=startup) as server:
        async with httpx.AsyncClient(**client_args) as client:
            for workload in opts.workloads:
                desc = f"{engine:>18} {workload.name:<12} {load.label}" + (f" round {k + 1}/{rounds}" if tag else "")
                with tqdm(total=opts.run.count(load), desc=desc, disable=not opts.progress, leave=True,
                          file=sys.stderr) as bar:
                    run = await run_one(server, client, engine, workload, load, vocab, opts.run,
                                        progress=lambda: bar.update())
                run.server.update(peak_rss_mb=peak_rss_mb(server.pid), pid=server.pid)
                keep(run)
