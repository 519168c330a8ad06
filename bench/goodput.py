"""Goodput at the SLO: open-loop Poisson arrivals at fractions of capacity, every engine, both SLOs.

    python bench/goodput.py --name goodput/dense [--model M | --family F] [--fractions 0.5 0.8 1 1.2 1.5]
                            [--requests 200] [--engines skippy single-lane llama-server llama-server-stock]
                            [--closed 8 32 64]

Stages, each a `python -m bench.gate sweep` into its own directory under bench/results/<name>/, each
skipped when its results.json is complete (an interrupted run resumes where it stopped; a long run
is split across sessions):

1. `n1/`: closed loop at N=1, every engine: the scaled SLO (TTFT <= 10x, TPOT <= 5x the engines'
   median N=1 p50), beside the seed's fixed one (TTFT <= 2000 ms, TPOT <= 200 ms).
2. `closed/`: closed loop at N=32 (and --closed), every engine, skippy told the scaled targets:
   capacity is the median req/s at N=32 over the engines but single-lane. Then `closed-fixed/`:
   skippy alone at the same N, told the fixed targets (the others know none: their `closed/` runs
   are scored under both SLOs).
3. `rate-<r>/<slo>/` for each rate = fraction x capacity and each SLO: every engine at that rate, the
   same seeded arrivals; skippy is told the SLO it is scored on (`--ttft-slo-ms/--tpot-slo-ms`: a user
   who is held to an SLO sets it), the other engines know no targets, so their runs under the first
   SLO are scored under both and only skippy runs again for the second (right after, at the same rate).
   With --shed-late, skippy with `--shed-late` runs beside it as `skippy-shed`.

Then summary.md, goodput.json and goodput.png (goodput vs offered rate, one line per engine, a panel
per SLO) with each engine's SLO capacity: the highest offered rate at which >= 90% of requests met both
targets (Sarathi-Serve's and DistServe's headline measure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gate.gate import render  # noqa: E402
from bench.gate.goodput_checks import goodput_checks  # noqa: E402
from bench.gate.metrics import Slo  # noqa: E402
from bench.gate.report import has_results, load_results, read_results, run_summary  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FIXED = Slo(2000.0, 200.0)
SCALE_TTFT, SCALE_TPOT = 10.0, 5.0
MEETS = 0.9  # SLO capacity: the share of requests within both targets


def sweep(out: Path, args: argparse.Namespace, engines: list[str], extra: list[str], skippy_args: str = "") -> Path:
    """One `bench.gate sweep` into `out`, unless a complete one is there already."""
    if has_results(out) and read_results(out).get("complete"):
        print(f"goodput: {out} done, kept", file=sys.stderr)
        return out
    argv = [sys.executable, "-m", "bench.gate", "sweep", "--out-dir", str(out.parent), "--name", out.name,
            "--engines", *engines, "--workloads", args.workload, "--no-batched-bench", "--quiet",
            "--seed", str(args.seed), *(["--model", args.model] if args.model else []),
            *(["--family", args.family] if args.family else []), *args.sweep_args, *extra]
    if skippy_args:
        argv.append(f"--skippy-args={skippy_args}")
    print("goodput: " + " ".join(argv[1:]), file=sys.stderr)
    subprocess.run(argv, check=True, cwd=Path(__file__).resolve().parents[1])
    return out


def summaries(path: Path, slo: Slo) -> dict[tuple[str, str], Any]:
    _, runs, _ = load_results(path)
    return {(r.engine, r.load.label): (r, run_summary(r, slo)) for r in runs}


def scaled_slo(n1: Path) -> Slo:
    rows = [s for (_, _), (_, s) in summaries(n1, Slo()).items()]
    ttft = statistics.median(s.ttft_p50_ms for s in rows if s.ttft_p50_ms)
    tpot = statistics.median(s.tpot_p50_ms for s in rows if s.tpot_p50_ms)
    return Slo(round(SCALE_TTFT * ttft, 1), round(SCALE_TPOT * tpot, 1))


def capacity(closed: Path) -> float:
    rates = [s.req_per_s for (engine, label), (_, s) in summaries(closed, Slo()).items()
             if label == "N=32" and engine != "single-lane"]
    return statistics.median(rates)


def targets(slo: Slo) -> str:
    return f"--ttft-slo-ms {slo.ttft_ms:g} --tpot-slo-ms {slo.tpot_ms:g}"


def _commit(out: Path) -> str:
    """The tree the runs ran on, as their first sweep (n1/) recorded it."""
    try:
        return str(read_results(out / "n1")["meta"]["git_commit"])[:7]
    except (OSError, ValueError, KeyError):
        return "unknown"


def met_share(run: Any, slo: Slo) -> float:
    from bench.gate.metrics import meets_slo

    records = list(run.measured())
    return sum(meets_slo(r, slo) for r in records) / len(records) if records else 0.0


def _cell(run: Any, s: Any, slo: Slo) -> dict[str, Any]:
    return {"goodput": s.goodput, "met": met_share(run, slo), "failed": s.failed, "ttft_p99_ms": s.ttft_p99_ms,
            "tpot_p50_ms": s.tpot_p50_ms, "req_per_s": s.req_per_s}


def closed_table(out: Path, slos: dict[str, Slo], engines: list[str]) -> dict[str, Any]:
    """Closed-loop goodput by N, engine and SLO: skippy's from the stage that told it that SLO (`closed/` the
    first, `closed-<key>/` the others), every other engine's from `closed/`, scored under each SLO."""
    table: dict[str, Any] = {}
    first = next(iter(slos))
    for key, slo in slos.items():
        for name in engines:
            path = out / ("closed" if key == first or name != "skippy" else f"closed-{key}")
            if not has_results(path):
                continue
            for (engine, label), (run, s) in summaries(path, slo).items():
                if engine == name and run.load.kind == "closed":
                    table.setdefault(label, {}).setdefault(name, {})[key] = _cell(run, s, slo)
    return dict(sorted(table.items(), key=lambda kv: int(kv[0].removeprefix("N="))))


def report(out: Path, slos: dict[str, Slo], cap: float, rates: list[float], fractions: list[float],
           engines: list[str], shed: bool, not_dense: bool = False) -> dict[str, Any]:
    table: dict[str, Any] = {"capacity_req_s": cap, "slos": {k: [v.ttft_ms, v.tpot_ms] for k, v in slos.items()},
                             "rates": {}, "slo_capacity": {}}
    names = engines + (["skippy-shed"] if shed else [])
    for rate in rates:
        row: dict[str, Any] = {}
        for key, slo in slos.items():
            first = out / f"rate-{rate:g}" / next(iter(slos))
            own = out / f"rate-{rate:g}" / key
            for name in names:
                src = own if name.startswith("skippy") else first
                engine = "skippy" if name.startswith("skippy") else name
                path = src if name != "skippy-shed" else out / f"rate-{rate:g}" / f"{key}-shed"
                if not has_results(path):
                    continue
                got = summaries(path, slo).get((engine, f"{rate:g} req/s"))
                if got is None:
                    continue
                row.setdefault(name, {})[key] = _cell(*got, slo)
        table["rates"][f"{rate:g}"] = row
    table["closed"] = closed_table(out, slos, engines)
    for name in names:
        for key in slos:
            ok = [r for r in rates if table["rates"][f"{r:g}"].get(name, {}).get(key, {}).get("met", 0) >= MEETS]
            table["slo_capacity"].setdefault(name, {})[key] = max(ok) if ok else 0.0
    (out / "goodput.json").write_text(json.dumps(table, indent=1))
    lines = [f"# Goodput at the SLO ({out.name})", "",
             f"Capacity {cap:.3g} req/s (closed loop at N=32, median over the engines but single-lane). "
             + "; ".join(f"{k} SLO: TTFT <= {v.ttft_ms:g} ms, TPOT <= {v.tpot_ms:g} ms" for k, v in slos.items())
             + ". skippy is told the SLO it is scored on; the others know no targets.", "",
             f"Command: `{' '.join(['python', 'bench/goodput.py', *sys.argv[1:]])}`; commit {_commit(out)}.", "",
             "| rate req/s | x capacity | " + " | ".join(f"{n} ({k})" for k in slos for n in names) + " |",
             "|---|---|" + "---|" * (len(names) * len(slos))]
    for rate, f in zip(rates, fractions):
        row = table["rates"][f"{rate:g}"]
        cells = [f"{row.get(n, {}).get(k, {}).get('goodput', float('nan')):.3f}" for k in slos for n in names]
        lines.append(f"| {rate:g} | {f:g} | " + " | ".join(cells) + " |")
    if table["closed"]:
        lines += ["", "Closed loop (skippy told the SLO it is scored on), goodput req/s:", "",
                  "| N | " + " | ".join(f"{n} ({k})" for k in slos for n in engines) + " |",
                  "|---|" + "---|" * (len(engines) * len(slos))]
        for label, row in table["closed"].items():
            cells = [f"{row.get(n, {}).get(k, {}).get('goodput', float('nan')):.3f}" for k in slos for n in engines]
            lines.append(f"| {label.removeprefix('N=')} | " + " | ".join(cells) + " |")
    lines += ["", f"SLO capacity (the highest offered rate with >= {MEETS:.0%} of requests within both targets):", ""]
    for name in names:
        lines.append(f"- {name}: " + ", ".join(f"{k} {table['slo_capacity'][name][k]:g} req/s" for k in slos))
    checks = goodput_checks(table, dense=not not_dense)
    lines += ["", f"## Checks (`python -m bench.gate check {out.name}`): "
              f"{sum(c.passed for c in checks)}/{len(checks)} pass", "", "```", render(checks), "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(out, table, names, slos)
    return table


def plot(out: Path, table: dict[str, Any], names: list[str], slos: dict[str, Slo]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(slos), figsize=(6 * len(slos), 4), squeeze=False)
    rates = sorted(float(r) for r in table["rates"])
    for ax, key in zip(axes[0], slos):
        for name in names:
            ys = [table["rates"][f"{r:g}"].get(name, {}).get(key, {}).get("goodput") for r in rates]
            pts = [(r, y) for r, y in zip(rates, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.plot(rates, rates, color="grey", linestyle=":", label="offered")
        ax.set_title(f"{key} SLO (TTFT {slos[key].ttft_ms:g} ms, TPOT {slos[key].tpot_ms:g} ms)")
        ax.set_xlabel("offered req/s")
        ax.set_ylabel("goodput req/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "goodput.png", dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="goodput/dense")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where <name>/ goes (default bench/results)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model")
    where.add_argument("--family")
    p.add_argument("--workload", default="chat")
    p.add_argument("--fractions", nargs="+", type=float, default=[0.5, 0.8, 1.0, 1.2, 1.5])
    p.add_argument("--requests", type=int, default=200, help="Poisson requests per rate per engine")
    p.add_argument("--engines", nargs="+", default=["skippy", "single-lane", "llama-server", "llama-server-stock"])
    p.add_argument("--closed", nargs="*", type=int, default=[], help="closed-loop N beside N=32 (e.g. 8 64)")
    p.add_argument("--capacity", type=float, help="req/s, instead of measuring it (stage 2)")
    p.add_argument("--shed-late", action="store_true", help="also run skippy --shed-late at every rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--not-dense", action="store_true", help="the checks of a class other than dense")
    p.add_argument("--sweep-args", nargs=argparse.REMAINDER, default=[],
                   help="the rest goes to every `bench.gate sweep` (e.g. --threads 2 --n-ctx 4096)")
    args = p.parse_args()
    out = args.out_dir / args.name
    out.mkdir(parents=True, exist_ok=True)
    n1 = sweep(out / "n1", args, args.engines, ["-N", "1", "--min-requests", "8", "--requests-per-worker", "8"])
    slos = {"scaled": scaled_slo(n1), "fixed": FIXED}
    if args.capacity is None:
        closed = sweep(out / "closed", args, args.engines, ["-N", "32", *map(str, args.closed),
                                                             "--requests-per-worker", "2"],
                       targets(slos["scaled"]))
        cap = capacity(closed)
        for key, slo in list(slos.items())[1:]:
            sweep(out / f"closed-{key}", args, ["skippy"], ["-N", "32", *map(str, args.closed),
                                                            "--requests-per-worker", "2"], targets(slo))
    else:
        cap = args.capacity
    rates = [float(f"{f * cap:.4g}") for f in args.fractions]
    print(f"goodput: capacity {cap:.3g} req/s; rates {rates}; SLOs {slos}", file=sys.stderr)
    poisson = ["-N", "--rates", "RATE", "--poisson-requests", str(args.requests)]
    for rate in rates:
        extra = [str(rate) if a == "RATE" else a for a in poisson]
        base = out / f"rate-{rate:g}"
        for i, (key, slo) in enumerate(slos.items()):
            slo_args = ["--slo-ttft-ms", str(slo.ttft_ms), "--slo-tpot-ms", str(slo.tpot_ms)]
            sweep(base / key, args, args.engines if i == 0 else ["skippy"], extra + slo_args, targets(slo))
            if args.shed_late:
                sweep(base / f"{key}-shed", args, ["skippy"], extra + slo_args, targets(slo) + " --shed-late")
        report(out, slos, cap, rates, args.fractions, args.engines, args.shed_late, args.not_dense)
    table = report(out, slos, cap, rates, args.fractions, args.engines, args.shed_late, args.not_dense)
    print(json.dumps(table["slo_capacity"]))


if __name__ == "__main__":
    main()
