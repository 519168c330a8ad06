"""python -m bench.gate {sweep,matrix,check,report,pack}: run a sweep or the matrix, judge it, or redraw its report.

    sweep   run engines x workloads x loads, write bench/results/<name>/ (JSON, summary.md, PNGs)
    matrix  a sweep, an overload and a goodput run per KV class, one verdict row per class (bench/gate/matrix.py)
    check   per-engine-pair verdicts over a results dir (per class for a matrix); exit 1 when new falls short
    report  rewrite summary.md and the plots from results.json (e.g. under another SLO)
    pack    gzip finished results.json files before committing them (every reader takes either form)

`sweep --quick` is the end-to-end smoke run (tiny synthetic model, N in {1, 4}, a few
requests, skippy, single-lane and llama-server); every quick default can still be overridden
(`--engines` any of the five). `matrix --quick` does the same for every class on its tiny model.
"""

from __future__ import annotations

import argparse
import sys
import json
from pathlib import Path
from typing import Any

import trio

from .engines import OLD, PEER, QUICK_ENGINES, STOCK
from .gate import DEFAULTS, Thresholds, gate, render
from .goodput_checks import goodput_checks
from .headroom import headrooms
from .matrix_cli import matrix_parser
from .matrix_dir import is_matrix, load_matrix
from .matrix_report import check_text, verdicts, write_matrix_report
from .metrics import Slo
from .report import load_results, pack, slo_of, summaries, write_report
from .peers import PeerError, main as peers_main
from .sweep import run_sweep
from .sweep_args import FULL, QUICK, RESULTS_ROOT, run_args, sweep_options, until_signal


def _sweep_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run a sweep and write bench/results/<name>/")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny synthetic llama, N in {1,4}, few requests")
    p.add_argument("--name", help=f"results subdirectory (default {FULL['name']}; quick: {QUICK['name']})")
    p.add_argument("--out-dir", type=Path, default=RESULTS_ROOT, help="where <name>/ goes (default bench/results)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", help="GGUF path or real model name (default: skippy's embedded SmolLM2)")
    where.add_argument("--family", help="a tiny synthetic model: llama, gemma2, deepseek2, falcon-h1, qwen3next")
    run_args(p, QUICK_ENGINES)
    p.set_defaults(func=_sweep)


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
    packer = sub.add_parser("pack", help="gzip each finished results.json under the given directories")
    packer.add_argument("dirs", type=Path, nargs="+")
    packer.add_argument("--min-kb", type=float, default=0.0, help="leave files smaller than this plain")
    packer.set_defaults(func=_pack)
    peers = sub.add_parser("peers", add_help=False,
                           help="install vLLM's CPU build into its own venv, make its weights (`peers --help`)")
    peers.set_defaults(func=lambda args: peers_main([]))  # reached through main(), which hands it the rest
    return parser


def _pack(args: argparse.Namespace) -> int:
    for root in args.dirs:
        for packed in pack(root, int(args.min_kb * 1024)):
            print(packed)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    opts = sweep_options(args)
    try:
        if not trio.run(until_signal, lambda: run_sweep(opts)):
            return 130
    except PeerError as e:
        print(f"bench.gate: error: {e}", file=sys.stderr)
        return 2
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
    data, classes = load_matrix(args.results)
    rows = verdicts(data, classes, _thresholds(args), _slo_override(args), args.at_n, args.workloads)
    print(check_text(rows))
    return 0 if rows and all(v.passed for _, v in rows) else 1


def _check(args: argparse.Namespace) -> int:
    if is_matrix(args.results):
        return _check_matrix(args)
    if (args.results / "goodput.json").exists():  # a bench/goodput.py run
        checks = goodput_checks(json.loads((args.results / "goodput.json").read_text()), dense=not args.not_dense)
        print(render(checks))
        return 0 if checks and all(c.passed for c in checks) else 1
    meta, runs, batched = load_results(args.results)
    thresholds = _thresholds(args)
    at_n = args.at_n or 32
    checks = gate(summaries(runs, _slo(args, meta)), at_n, thresholds, args.workloads,
                  headrooms=headrooms(meta, batched, at_n))
    print(render(checks))
    return 0 if checks and all(c.passed for c in checks) else 1


def _report(args: argparse.Namespace) -> int:
    if is_matrix(args.results):
        print(write_matrix_report(args.results, slo_override=_slo_override(args)))
        return 0
    meta, runs, batched = load_results(args.results)
    out = args.results if args.results.is_dir() else args.results.parent
    write_report(out, meta, runs, batched, _slo(args, meta))
    print(out / "summary.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["peers"]:  # its own parser, --help included
        return peers_main(argv[1:])
    args = _parser().parse_args(argv)
    return args.func(args)
