"""python -m bench.gate {sweep,matrix,check,report}: run a sweep or the matrix, judge it, or redraw its report.

    sweep   run engines x workloads x loads, write bench/results/<name>/ (JSON, summary.md, PNGs)
    matrix  a sweep, an overload and a goodput run per KV class, one verdict row per class (bench/gate/matrix.py)
    check   per-engine-pair verdicts over a results dir (per class for a matrix); exit 1 when new falls short
    report  rewrite summary.md and the plots from results.json (e.g. under another SLO)

`sweep --quick` is the end-to-end smoke run (tiny synthetic model, N in {1, 4}, a few
requests, skippy, single-lane and llama-server); every quick default can still be overridden
(`--engines` any of the five). `matrix --quick` does the same for every class on its tiny model.
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

from .engines import ENGINES, OLD, PEER, QUICK_ENGINES, STOCK, ServerConfig
from .gate import DEFAULTS, Thresholds, gate, render
from .metrics import Slo
from .model import ModelSpec
from .report import load_results, slo_of, summaries, write_report
from .runner import RunConfig
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
def _sweep_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run a sweep and write bench/results/<name>/")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny synthetic llama, N in {1,4}, few requests")
    p.add_argument("--name", help=f"results subdirectory (default {FULL['name']}; quick: {QUICK['name']})")
    p.add_argument("--out-dir", type=Path, default=RESULTS_ROOT, help="where <name>/ goes (default bench/results)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", help="GGUF path or real model name (default: skippy's embedded SmolLM2)")
    where.add_argument("--family", help="a tiny synthetic model: llama, gemma2, deepseek2, falcon-h1, qwen3next")
    _run_args(p, QUICK_ENGINES)
    p.set_defaults(func=_sweep)


def _run_args(p: argparse.ArgumentParser, quick_engines: Sequence[str]) -> None:
    """The options a sweep and the matrix share."""
    p.add_argument("--engines", nargs="+", choices=ENGINES,
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


def _thresholds_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--at-n", type=int, help="the target concurrency of the @N checks (default 32; a matrix: "
                   "each class's own, 32 where swept)")
    p.add_argument("--vs-single-lane-throughput", type=float, default=DEFAULTS[OLD].throughput_ratio)
    p.add_argument("--vs-single-lane-goodput", type=float, default=DEFAULTS[OLD].goodput_ratio)
    p.add_argument("--vs-llama-throughput", type=float, default=DEFAULTS[PEER].throughput_ratio)
    p.add_argument("--vs-llama-goodput", type=float, default=DEFAULTS[PEER].goodput_ratio,
                   help="--vs-llama-* apply to llama-server and llama-server-stock alike")
    p.add_argument("--p99-ttft-slack", type=float, default=0.0,
                   help="new p99 TTFT may exceed the reference's by this fraction (default 0)")
    p.add_argument("--n1-tolerance", type=float, default=0.05,
                   help="allowed N=1 (and curve) throughput shortfall, a fraction (default 0.05)")
    p.add_argument("--workloads", nargs="+", help="judge only these workloads")


def _slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo-ttft-ms", type=float, help="override the sweep's SLO (recomputed from the records)")
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--slo-e2e-ms", type=float)


def _slo(args: argparse.Namespace, meta: dict[str, Any]) -> Slo:
    base = slo_of(meta)
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None and args.slo_e2e_ms is None:
        return base
    return Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gate", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _sweep_parser(sub)
    from .matrix_cli import matrix_parser

    matrix_parser(sub)
    check = sub.add_parser("check", help="per-engine-pair verdicts; exit 1 when new falls short")
    check.add_argument("results", type=Path, help="a results directory (or its results.json), or a "
                       "bench/goodput.py run (its goodput.json: the goodput checks)")
    check.add_argument("--not-dense", action="store_true", help="a goodput run of a class other than dense: its "
                       "SLO capacity need only match llama-server's, and no lead is required")
    _thresholds_args(check)
    _slo_args(check)
    check.set_defaults(func=_check)
    report = sub.add_parser("report", help="rewrite summary.md and the plots from results.json")
    report.add_argument("results", type=Path)
    _slo_args(report)
    report.set_defaults(func=_report)
    return parser


def sweep_options(args: argparse.Namespace, full: dict[str, Any] = FULL, quick: dict[str, Any] = QUICK):
    """SweepOptions from the command line: explicit options over quick defaults over full ones."""
    from .sweep import SweepOptions

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


async def _until_signal(main: Callable[[], Any]) -> bool:
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


def _sweep(args: argparse.Namespace) -> int:
    from .sweep import run_sweep

    opts = sweep_options(args)
    if not trio.run(_until_signal, lambda: run_sweep(opts)):
        return 130
    print(opts.out)
    return 0


def _thresholds(args: argparse.Namespace) -> dict[str, Thresholds]:
    peer = Thresholds(args.vs_llama_throughput, args.vs_llama_goodput, args.p99_ttft_slack, args.n1_tolerance)
    return {
        OLD: Thresholds(args.vs_single_lane_throughput, args.vs_single_lane_goodput, args.p99_ttft_slack,
                        args.n1_tolerance),
        PEER: peer,
        STOCK: peer,
    }


def _slo_override(args: argparse.Namespace) -> Slo | None:
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None and args.slo_e2e_ms is None:
        return None
    return Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)


def _check_matrix(args: argparse.Namespace) -> int:
    from .matrix import load_matrix
    from .matrix_report import check_text, verdicts

    data, classes = load_matrix(args.results)
    rows = verdicts(data, classes, _thresholds(args), _slo_override(args), args.at_n, args.workloads)
    print(check_text(rows))
    return 0 if rows and all(v.passed for _, v in rows) else 1


def _check(args: argparse.Namespace) -> int:
    from .matrix import is_matrix

    if is_matrix(args.results):
        return _check_matrix(args)
    if (args.results / "goodput.json").exists():  # a bench/goodput.py run
        from .goodput_checks import goodput_checks

        checks = goodput_checks(json.loads((args.results / "goodput.json").read_text()), dense=not args.not_dense)
        print(render(checks))
        return 0 if checks and all(c.passed for c in checks) else 1
    meta, runs, _ = load_results(args.results)
    thresholds = _thresholds(args)
    checks = gate(summaries(runs, _slo(args, meta)), args.at_n or 32, thresholds, args.workloads)
    print(render(checks))
    return 0 if checks and all(c.passed for c in checks) else 1


def _report(args: argparse.Namespace) -> int:
    from .matrix import is_matrix
    from .matrix_report import write_matrix_report

    if is_matrix(args.results):
        print(write_matrix_report(args.results, slo_override=_slo_override(args)))
        return 0
    meta, runs, batched = load_results(args.results)
    out = args.results if args.results.is_dir() else args.results.parent
    write_report(out, meta, runs, batched, _slo(args, meta))
    print(out / "summary.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)
