"""`python -m bench.gate matrix`: its options, defaults and entry point (the runner is matrix.py).

Kept apart from cli.py so the sweep's command line stays as it was; the matrix reuses the
sweep's options (sweep_args.run_args) and builds one SweepOptions per class with
sweep_args.sweep_options.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

import attrs
import trio

from .matrix import (
    CLASS_NAMES,
    CLASSES,
    MatrixOptions,
    OverloadPlan,
    auto_n_ctx,
    class_model,
    run_matrix,
)
from .matrix_goodput import GOODPUT_FRACTIONS, as_swept
from .report import read_results
from .sweep import SweepOptions
from .sweep_args import FULL, QUICK, RESULTS_ROOT, run_args, sweep_options, until_signal
from .verdict import SloScale

# the matrix: every class at N up to 64 on chat, gen (128 -> 256), the shared-prefix chat and the
# prompt-heavy rag512 (512 -> 64) and rag (1024 -> 64); n_ctx None = big enough for the largest N at
# full length (matrix.auto_n_ctx, at least the floor below)
MATRIX: dict[str, Any] = dict(
    FULL, name="matrix", workloads=["chat", "gen", "chat-shared", "rag512", "rag"], concurrency=[1, 2, 4, 8, 16, 32, 64],
    requests_per_worker=2, min_requests=16, long_out=256, n_ctx=None,
)
MATRIX_QUICK: dict[str, Any] = dict(
    QUICK, name="matrix-quick", engines=["skippy", "llama-server"], workloads=["chat", "gen", "chat-shared"],
    concurrency=[1, 4], requests_per_worker=1,
    min_requests=4, long_out=16, n_ctx=None,
)
N_CTX_FLOOR = {False: 4096, True: 1024}  # auto n_ctx never goes below this (full, quick)
OVERLOAD = {False: dict(n=64, lanes=16, waiting=16), True: dict(n=8, lanes=2, waiting=2)}


def matrix_parser(sub: Any) -> None:
    p = sub.add_parser("matrix", help="the gate for every KV class: a sweep, an overload and a goodput run per class, "
                                      "one verdict row each in bench/results/<name>/summary.md")
    p.add_argument("--quick", action="store_true",
                   help="CI run: each class's tiny synthetic model, N in {1,4}, skippy and llama-server, few requests")
    p.add_argument("--name", help=f"results subdirectory (default {MATRIX['name']}; quick: {MATRIX_QUICK['name']})")
    p.add_argument("--out-dir", type=Path, default=RESULTS_ROOT, help="where <name>/ goes (default bench/results)")
    p.add_argument("--classes", nargs="+", choices=CLASS_NAMES, help=f"default: all ({' '.join(CLASS_NAMES)})")
    p.add_argument("--class-n", action="append", default=[], metavar="CLASS=N,N,...",
                   help="closed-loop N for one class instead of -N (repeatable), e.g. --class-n mla=1,8,32")
    p.add_argument("--overload-n", type=int, help=f"overload workers (default {OVERLOAD[False]['n']}; "
                   f"quick {OVERLOAD[True]['n']})")
    p.add_argument("--overload-lanes", type=int, help="skippy --n-seq-max and llama-server -np of the overload run "
                   f"(default {OVERLOAD[False]['lanes']}; quick {OVERLOAD[True]['lanes']})")
    p.add_argument("--overload-waiting", type=int, help="skippy --max-waiting of the overload run (default "
                   f"{OVERLOAD[False]['waiting']}; quick {OVERLOAD[True]['waiting']})")
    p.add_argument("--no-overload", action="store_true", help="skip the overload runs (the verdicts then fail)")
    p.add_argument("--slo-scale-ttft", type=float, default=SloScale().ttft_x,
                   help="scaled SLO: TTFT <= this x the engines' median N=1 TTFT p50 (default %(default)s)")
    p.add_argument("--slo-scale-tpot", type=float, default=SloScale().tpot_x,
                   help="scaled SLO: TPOT <= this x the engines' median N=1 TPOT p50 (default %(default)s)")
    p.add_argument("--at-n", type=int, help="the N of the @N checks (default 32 where swept, else the largest N)")
    p.add_argument("--goodput-fractions", nargs="+", type=float, metavar="F",
                   help="the goodput run's Poisson rates, as fractions of the class's capacity (median closed-loop "
                   "req/s at N* of the engines but single-lane, chat); requests per rate: --poisson-requests "
                   f"(default {' '.join(map(str, GOODPUT_FRACTIONS[False]))}; quick "
                   f"{' '.join(map(str, GOODPUT_FRACTIONS[True]))})")
    goodput = p.add_mutually_exclusive_group()
    goodput.add_argument("--no-goodput", action="store_true", help="skip the goodput (open-loop Poisson) runs")
    goodput.add_argument("--goodput-only", action="store_true",
                         help="only the goodput runs of --classes, scaled to the closed loop an earlier matrix in "
                         "the same directory measured (its engines, workloads and pool unless given here); "
                         "matrix.json keeps everything else")
    run_args(p, tuple(MATRIX_QUICK["engines"]))
    p.set_defaults(func=run)


def _class_n(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """--class-n mla=1,8,32 -> {"mla": (1, 8, 32)}."""
    out = {}
    for spec in specs:
        name, sep, ns = spec.partition("=")
        try:
            values = tuple(int(n) for n in ns.split(",") if n)
        except ValueError:
            values = ()
        if not sep or not values:
            raise SystemExit(f"bench: --class-n wants CLASS=N,N,... (got {spec!r})")
        out[name] = values
    return out


def matrix_options(args: argparse.Namespace) -> MatrixOptions:
    """MatrixOptions: per class the sweep options of the command line over the matrix defaults,
    with the class's model, its own N (--class-n) and a pool that holds them (unless --n-ctx)."""
    chosen = [c for c in CLASSES if not args.classes or c.name in args.classes]
    per_class = _class_n(args.class_n)
    unknown = set(per_class) - {c.name for c in CLASSES}
    if unknown:
        raise SystemExit(f"bench: --class-n for unknown class {', '.join(sorted(unknown))}")
    name = args.name or (MATRIX_QUICK if args.quick else MATRIX)["name"]
    out = args.out_dir / name
    sweeps = {}
    for c in chosen:
        spec = class_model(c, args.quick)
        ns = argparse.Namespace(**{**vars(args), "model": spec.model, "family": spec.family,
                                   "concurrency": per_class.get(c.name, args.concurrency)})
        opts = sweep_options(ns, MATRIX, MATRIX_QUICK)
        n_ctx = args.n_ctx or auto_n_ctx(opts.concurrency, opts.workloads, N_CTX_FLOOR[args.quick])
        sweeps[c.name] = attrs.evolve(opts, out=out / c.name, server=attrs.evolve(opts.server, n_ctx=n_ctx),
                                      batched_bench=opts.batched_bench and not args.quick)
    if args.goodput_only:
        sweeps = {name: _as_swept(sweep, args) for name, sweep in sweeps.items()}
    fractions = tuple(args.goodput_fractions or GOODPUT_FRACTIONS[args.quick])
    if any(f <= 0 for f in fractions):
        raise SystemExit("bench: --goodput-fractions must be positive")
    plan = {**OVERLOAD[args.quick], **{k: v for k, v in (("n", args.overload_n), ("lanes", args.overload_lanes),
                                                          ("waiting", args.overload_waiting)) if v is not None}}
    return MatrixOptions(out=out, classes=tuple(chosen), sweeps=sweeps,
                         overload=None if args.no_overload else OverloadPlan(**plan),
                         scale=SloScale(args.slo_scale_ttft, args.slo_scale_tpot), at_n=args.at_n, quick=args.quick,
                         goodput=() if args.no_goodput else fractions, goodput_only=args.goodput_only)


def _as_swept(sweep: SweepOptions, args: argparse.Namespace) -> SweepOptions:
    """--goodput-only: the class's sweep as its results.json ran it, but for what is given here."""
    try:
        meta = read_results(sweep.out)["meta"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"bench: --goodput-only needs the closed-loop results in {sweep.out}: {e}") from e
    return as_swept(sweep, meta, [k for k in ("engines", "workloads", "n_ctx", "threads", "n_batch")
                                  if getattr(args, k, None) is not None])


def run(args: argparse.Namespace) -> int:
    opts = matrix_options(args)
    if not trio.run(until_signal, lambda: run_matrix(opts)):
        return 130
    print(opts.out / "summary.md")
    return 0
