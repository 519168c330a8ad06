"""Replicas behind sglang-router, side by side: 1, 2 and 4 `skippy serve` replicas under
cache_aware, round_robin and power_of_two, on one multi-turn chat workload.

    python -m bench.replicas [--sessions 32 64] [--replicas 1 2 4] [--rounds 1] [--out DIR]

First a calibration cell (one session alone on one replica) fixes the SLO by the gate's scaled
rule; then every (sessions, replicas, policy) cell, policies interleaved, rounds alternating in
order. Each finished cell is written to DIR/cells/<key>.json at once, and a rerun skips the cells
already there, so a long run resumes where it stopped. summary.md, results.json and plots.png
are rewritten from the cells after every cell (--render-only: from what is on disk).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import trio

from bench.gate.sweep import _git_commit, isa

from . import report
from .run import Cell, Setup, run_cell
from .summary import calibrated_slo, done_checks, summarize_cell
from .workload import make_script

CALIBRATION = "calibration"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.split("\n")[0])
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", default=None, help="GGUF path or real model name (default: the embedded SmolLM2)")
    model.add_argument("--family", default=None, help="a tiny synthetic model instead (CI-sized runs)")
    p.add_argument("--sessions", nargs="+", type=int, default=[32, 64])
    p.add_argument("--replicas", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin", "power_of_two"])
    p.add_argument("--rounds", type=int, default=1, help="repeat every cell, order reversed on odd rounds")
    p.add_argument("--turns", nargs=2, type=int, default=[4, 6], metavar=("MIN", "MAX"))
    p.add_argument("--system-words", type=int, default=200)
    p.add_argument("--user-words", type=int, default=40)
    p.add_argument("--one-shot", type=float, default=0.1, help="share of requests that are unique one-shots")
    p.add_argument("--gen", type=int, default=32, help="output tokens per request (ignore_eos)")
    p.add_argument("--rate", type=float, default=0.5,
                   help="requests per second the sessions offer in all while every one is running: each pauses "
                        "sessions / rate seconds (mean) between its requests, and they start spread over that "
                        "long (default 0.5: about 0.9x one replica's saturated throughput of SmolLM2 on 2 AVX2 cores)")
    p.add_argument("--think-s", type=float, default=None, help="the mean pause itself (instead of --rate)")
    p.add_argument("--ramp-s", type=float, default=None, help="sessions start within this (default: the pause)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads in all, split over replicas")
    p.add_argument("--n-ctx", type=int, default=16384, help="each replica's KV pool")
    p.add_argument("--prefix-slots", type=int, default=32, help="each replica's resident prefixes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench/results/replicas"))
    p.add_argument("--render-only", action="store_true")
    return p.parse_args(argv)


def serve_args(args: argparse.Namespace) -> tuple[str, ...]:
    model = ["--family", args.family] if args.family else (["--model", args.model] if args.model else [])
    # replicas batched by name, as the committed run measured them, never left to the cutover switch
    return (*model, "--n-ctx", str(args.n_ctx), "--prefix-slots", str(args.prefix_slots), "--scheduler", "batched")


def cells(args: argparse.Namespace) -> list[Cell]:
    """Every measured cell in run order: policies interleaved within a replica count; one cell
    (the first policy) for a single replica, where the policy has nothing to choose."""
    out: list[Cell] = []
    for rnd in range(args.rounds):
        one = [Cell(s, k, p, rnd) for s in args.sessions for k in args.replicas
               for p in (args.policies if k > 1 else args.policies[:1])]
        out += one if rnd % 2 == 0 else one[::-1]
    return out


def think_s(args: argparse.Namespace, sessions: int) -> float:
    """The mean pause between a session's requests: given, or what offers --rate in all."""
    return args.think_s if args.think_s is not None else sessions / args.rate


def _setup(args: argparse.Namespace, sessions: int) -> Setup:
    """A cell's setup; `sessions` 0 is the calibration (one session alone, no pauses)."""
    think = think_s(args, sessions) if sessions else 0.0
    ramp = args.ramp_s if args.ramp_s is not None else think
    return Setup(serve_args=serve_args(args), total_threads=args.threads, gen=args.gen, think_s=think,
                 ramp_s=ramp if sessions else 0.0, seed=args.seed)


def _workload(args: argparse.Namespace) -> str:
    return (f"{'/'.join(map(str, args.sessions))} sessions of {args.turns[0]}-{args.turns[1]} turns, a "
            f"{args.system_words}-word shared system prompt, {args.user_words}-word user turns, {args.gen} output "
            f"tokens (ignore_eos), {args.one_shot:.0%} unique one-shots; "
            + (f"think time uniform over 0.5-1.5 x {args.think_s:g} s" if args.think_s is not None else
               f"think time uniform over 0.5-1.5 x sessions / {args.rate:g} s, offering up to {args.rate:g} req/s")
            + (f", sessions starting within {args.ramp_s:g} s" if args.ramp_s is not None else
               ", sessions starting spread over one think time")
            + f"; seed {args.seed}")


def meta(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    try:
        router = version("sglang-router")
    except Exception:  # noqa: BLE001 - only a label in the report
        router = "?"
    return {"command": " ".join(["python -m bench.replicas", *argv]), "model": args.family or args.model or "SmolLM2",
            "machine": platform.processor() or platform.machine(), "isa": isa(), "cpus": os.cpu_count(),
            "router_version": router, "commit": (_git_commit() or "?")[:12], "workload": _workload(args),
            "serve_args": list(serve_args(args)), "total_threads": args.threads}


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def render(out: Path) -> None:
    saved = _load(out / "meta.json")
    calibration = _load(out / "cells" / f"{CALIBRATION}.json")
    if saved is None or calibration is None:
        return
    slo = calibrated_slo(calibration)
    rows = [summarize_cell(json.loads(p.read_text()), slo) for p in sorted((out / "cells").glob("s*.json"))]
    rows.sort(key=lambda r: (r.sessions, r.replicas, r.policy, r.round))
    checks = done_checks(rows)
    (out / "summary.md").write_text(report.markdown(saved, slo, rows, checks))
    (out / "results.json").write_text(json.dumps({"meta": saved, "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
                                                  **report.rows_json(rows, checks)}, indent=1))
    if rows:
        report.plot(rows, out / "plots.png")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    out: Path = args.out
    if args.render_only:
        render(out)
        return 0
    (out / "cells").mkdir(parents=True, exist_ok=True)
    if not (out / "meta.json").exists():
        (out / "meta.json").write_text(json.dumps(meta(args, argv), indent=1))
    kw = dict(turns=tuple(args.turns), system_words=args.system_words, user_words=args.user_words, seed=args.seed)
    todo: list[tuple[str, Cell, Any]] = [(CALIBRATION, Cell(1, 1, args.policies[0]), make_script(1, one_shot_share=0, **kw))]
    todo += [(c.key, c, make_script(c.sessions, one_shot_share=args.one_shot, **kw)) for c in cells(args)]
    for key, cell, script in todo:
        setup = _setup(args, cell.sessions if key != CALIBRATION else 0)
        path = out / "cells" / f"{key}.json"
        if path.exists():
            continue
        print(f"bench.replicas: {key}: {script.requests} requests ({script.one_shots} one-shots)", file=sys.stderr,
              flush=True)
        result = trio.run(run_cell, cell, script, setup, out / "logs" / key)
        path.write_text(json.dumps(result))
        render(out)
    render(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
