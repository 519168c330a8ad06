"""The sweep's command line, shared by `sweep` (cli.py) and `matrix` (matrix_cli.py): the run options,
their full and quick defaults, SweepOptions built from them, and running a command until a signal.

Apart from cli.py because matrix_cli.py builds on these and cli.py registers the matrix command:
each importing the other was a circle.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import trio

from .engines import ENGINES, KNOWN, QUICK_ENGINES, ServerConfig
from .metrics import Slo
from .model import ModelSpec
from .runner import RunConfig
from .sweep import SweepOptions
from .workloads import Lengths, make_workload, workload_names

RESULTS_ROOT = Path(__file__).resolve().parents[1] / "results"

# what a full sweep uses unless told otherwise, and what --quick changes
FULL: dict[str, Any] = dict(
    name="gate", family=None, model=None, engines=list(ENGINES), workloads=["chat", "chat-shared"],
    concurrency=[1, 2, 4, 8, 16, 32], rates=[], requests_per_worker=3, min_requests=16, poisson_requests=64,
    warmup=2, threads=2, n_ctx=4096, n_batch=512, short_in=128, long_in=1024, short_out=64, long_out=512,
    shared_fraction=0.75, slo_ttft_ms=2000.0, slo_tpot_ms=200.0, slo_e2e_ms=None, open_slots=32,
    request_timeout=900.0, startup_timeout=180.0,
)
QUICK: dict[str, Any] = dict(
    name="quick", family="llama", engines=list(QUICK_ENGINES), concurrency=[1, 4], requests_per_worker=2,
    min_requests=4, poisson_requests=6,
    warmup=1, n_ctx=1024, n_batch=64, short_in=32, long_in=128, short_out=8, long_out=32,
    slo_ttft_ms=1000.0, slo_tpot_ms=100.0, request_timeout=60.0, startup_timeout=60.0,
)


def run_args(p: argparse.ArgumentParser, quick_engines: Sequence[str]) -> None:
    """The options a sweep and the matrix share."""
    p.add_argument("--engines", nargs="+", choices=KNOWN,
                   help=f"default: all ({' '.join(ENGINES)}); --quick: {' '.join(quick_engines)}")
    p.add_argument("--workloads", nargs="+", choices=workload_names())
    p.add_argument("--concurrency", "-N", nargs="*", type=int, help="closed-loop N values")
    p.add_argument("--rates", nargs="+", type=float, help="open-loop Poisson rates (req/s)")
    p.add_argument("--requests-per-worker", type=int, help="closed loop: requests = max(min, this x N)")
    p.add_argument("--min-requests", type=int)
    p.add_argument("--poisson-requests", type=int, help="requests per Poisson run")
    p.add_argument("--warmup", type=int, help="warm-up requests per run (excluded from figures)")
    p.add_argument("--threads", type=int)
    p.add_argument("--n-ctx", type=int, help="the shared KV pool, the same for every engine")
    p.add_argument("--n-batch", type=int)
    for name in ("short-in", "long-in", "short-out", "long-out"):
        p.add_argument(f"--{name}", type=int, help=f"{name.replace('-', ' ')} length in tokens")
    p.add_argument("--shared-fraction", type=float, help="share of the prompt that is the shared system prompt")
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--slo-e2e-ms", type=float)
    p.add_argument("--skippy-args", default="", help="extra `skippy serve` options for skippy, skippy-fast and "
                   "single-lane, quoted, with '=': --skippy-args='--no-prefix-cache --tpot-target-ms 50'")
    p.add_argument("--llama-server-args", default="", help="extra llama-server options for llama-server and "
                   "llama-server-stock, e.g. --llama-server-args='--cache-ram 0'")
    p.add_argument("--open-slots", type=int, help="llama-server -np under Poisson load")
    p.add_argument("--request-timeout", type=float)
    p.add_argument("--startup-timeout", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--sampling", type=json.loads, default=None,
                   help='request fields over --temperature, as JSON: \'{"temperature": 1, "top_k": 0, "top_p": 1, '
                        '"min_p": 0}\' samples the whole vocabulary in every engine (llama-server fills top_k, '
                        'top_p and min_p from its own defaults otherwise)')
    p.add_argument("--rounds", type=int, default=1, help="repeat each engine's block this many times per load, "
                   "engines alternating order each round, requests pooled per engine (N=1 rows drift ~10%% "
                   "between sequential blocks on a 2-core box)")
    p.add_argument("--rounds-up-to", type=int, help="only closed loads with N <= this get --rounds (default: all)")
    p.add_argument("--no-batched-bench", action="store_true", help="skip the llama-batched-bench reference")
    p.add_argument("--quiet", action="store_true", help="no progress bars")



def sweep_options(args: argparse.Namespace, full: dict[str, Any] = FULL, quick: dict[str, Any] = QUICK) -> SweepOptions:
    """SweepOptions from the command line: explicit options over quick defaults over full ones."""
    base = {**full, **(quick if args.quick else {})}
    if getattr(args, "model", None) is not None or getattr(args, "family", None) is not None:
        base.update(model=args.model, family=args.family)
    v = {k: (getattr(args, k) if getattr(args, k, None) is not None else d) for k, d in base.items()}
    lengths = Lengths(v["short_in"], v["long_in"], v["short_out"], v["long_out"], v["shared_fraction"])
    return SweepOptions(
        out=args.out_dir / v["name"],
        server=ServerConfig(ModelSpec.resolve(v["model"], v["family"]), v["threads"], v["n_ctx"], v["n_batch"],
                            tuple(shlex.split(args.skippy_args)), tuple(shlex.split(args.llama_server_args))),
        run=RunConfig(v["requests_per_worker"], v["min_requests"], v["poisson_requests"], v["warmup"],
                      args.temperature, args.seed, sampling=args.sampling or {}),
        engines=tuple(v["engines"]),
        workloads=tuple(make_workload(w, lengths) for w in v["workloads"]),
        lengths=lengths,
        concurrency=tuple(v["concurrency"]),
        rates=tuple(v["rates"]),
        open_slots=v["open_slots"],
        slo=Slo(v["slo_ttft_ms"], v["slo_tpot_ms"], v["slo_e2e_ms"]),
        request_timeout=v["request_timeout"],
        startup_timeout=v["startup_timeout"],
        batched_bench=not args.no_batched_bench,
        progress=not args.quiet,
        rounds=_rounds(getattr(args, "rounds", 1)),
        rounds_up_to=getattr(args, "rounds_up_to", None),
    )


def _rounds(k: int) -> int:
    if k < 1:
        raise SystemExit(f"bench.gate: --rounds must be >= 1, got {k}")
    return k


async def until_signal(main: Callable[[], Any]) -> bool:
    """Run `main`; SIGTERM/SIGINT cancel it, so every server is still stopped on the way out.
    True when `main` finished."""
    done = False
    async with trio.open_nursery() as nursery:
        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    print("bench: interrupted; stopping servers", file=sys.stderr)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch)
        await main()
        done = True
        nursery.cancel_scope.cancel()
    return done

