"""The cutover gate for every KV class: per class one interleaved sweep (sweep.run_sweep, as it
is) and one overload run, then one verdict row per class (verdict.py, matrix_report.py).

Why per class: skippy's scheduler counts KV memory per component, and each class (dense GQA,
ISWA, MLA, Mamba2 hybrid, gated delta-net hybrid) stresses that ledger and llama.cpp's kernels
differently, so a win on SmolLM2 says nothing about the others. The full matrix runs real small
models where the package carries them (SmolLM2, Gemma-3-270M) and seeded ~300M synthetic ones
in the dims of a small real model elsewhere (skippy.models.synth.BASE); `--quick` runs the tiny
synthetic model of every class so the harness is exercised in CI.

Layout: <out>/matrix.json (configuration, per-class wall time and command; a later run into the
same directory keeps the classes it does not rerun), <out>/summary.md (verdict rows),
<out>/<class>/ (the sweep's results.json, summary.md, plots, logs, gate.txt) and
<out>/<class>/overload/ (the overload run, a sweep of its own) and <out>/<class>/goodput/ (open-loop
Poisson at fractions of the class's capacity, matrix_goodput.py); matrix_dir.py reads it back.
`--goodput-only` adds the goodput run to classes an earlier matrix measured, keeping everything
else of matrix.json.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

from .engines import FAST, NEW, PEER, STOCK
from .matrix_dir import MATRIX_JSON, OVERLOAD_DIR
from .matrix_goodput import chat_workload, run_goodput
from .matrix_report import write_matrix_report
from .report import has_results
from .model import ModelSpec
from .sweep import SweepOptions, _git_commit, run_sweep
from .verdict import SloScale
from .workloads import Workload

OVERLOAD_ENGINES = (NEW, FAST, PEER, STOCK)  # single-lane is the ceiling of one by definition


@attrs.frozen
class GateClass:
    """A KV structural class and the model that stands for it."""

    name: str
    about: str
    family: str  # the synthetic family (quick; and base when there is no real model)
    real: str | None = None  # a real model the package carries (skippy.models.REAL_MODELS)


CLASSES: tuple[GateClass, ...] = (
    GateClass("dense", "dense GQA KV cache", "llama", real="smollm2"),
    GateClass("iswa", "sliding-window + global attention (ISWA)", "gemma2", real="gemma3"),
    GateClass("mla", "multi-head latent attention (one K-only latent row per token)", "deepseek2"),
    GateClass("ssm-hybrid", "Mamba2 mixer + attention in every layer (KV cells + recurrent state)", "falcon-h1"),
    GateClass("linear-hybrid", "gated delta-net + full attention every 4th layer (MoE FFN)", "qwen3next"),
)
CLASS_NAMES = tuple(c.name for c in CLASSES)


def class_model(c: GateClass, quick: bool) -> ModelSpec:
    """The tiny synthetic model (quick), the real model, or the base-size synthetic one (written
    once: about a minute the first time)."""
    if quick:
        return ModelSpec.resolve(None, c.family)
    if c.real is not None:
        return ModelSpec.resolve(c.real, None)
    from skippy.models import synthetic_model

    path = synthetic_model(c.family, size="base").resolve()
    return ModelSpec(str(path), None, path)


def auto_n_ctx(concurrency: Sequence[int], workloads: Sequence[Workload], floor: int) -> int:
    """A pool that holds every session of the largest N at full length (rounded up to 256 cells):
    the matrix measures scheduling and kernels, not KV pressure (the stress runs do that)."""
    need = max(concurrency, default=1) * max((w.max_input_len + w.output_len for w in workloads), default=0)
    return max(floor, -(-need // 256) * 256)


@attrs.frozen
class OverloadPlan:
    """N closed-loop workers against a ceiling of `lanes` sessions and `waiting` queued requests."""

    n: int
    lanes: int
    waiting: int


def overload_options(sweep: SweepOptions, plan: OverloadPlan) -> SweepOptions:
    """The class's sweep turned into its overload run: chat only, N above the lane ceiling,
    skippy capped at `lanes` running and `waiting` queued (past that: 429), llama-server at
    `-np lanes` (it queues without bound)."""
    server = attrs.evolve(sweep.server, skippy_extra=sweep.server.skippy_extra + (
        "--n-seq-max", str(plan.lanes), "--max-waiting", str(plan.waiting)))
    return attrs.evolve(sweep, out=sweep.out / OVERLOAD_DIR, server=server,
                        engines=tuple(e for e in sweep.engines if e in OVERLOAD_ENGINES),
                        workloads=chat_workload(sweep.workloads), concurrency=(plan.n,), rates=(), slots=plan.lanes,
                        batched_bench=False)


@attrs.frozen
class MatrixOptions:
    out: Path
    classes: tuple[GateClass, ...]
    sweeps: dict[str, SweepOptions] = attrs.field(hash=False)  # class name -> its sweep
    overload: OverloadPlan | None
    scale: SloScale
    at_n: int | None  # None: 32 where swept, else the largest N of the class
    quick: bool = False
    goodput: tuple[float, ...] = ()  # the goodput run's fractions of capacity; () skips it
    goodput_only: bool = False  # only the goodput run, on an earlier matrix's closed loop


def at_n_of(opts: MatrixOptions, name: str) -> int:
    ns = opts.sweeps[name].concurrency
    return opts.at_n if opts.at_n is not None else (32 if 32 in ns else max(ns))


def _meta(opts: MatrixOptions) -> dict[str, Any]:
    first = next(iter(opts.sweeps.values()))
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["python", "-m", "bench.gate", *sys.argv[1:]],
        "git_commit": _git_commit(),
        "host": {"node": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "quick": opts.quick,
        "engines": list(first.engines),
        "fixed_slo": attrs.asdict(first.slo),
        "slo_scale": attrs.asdict(opts.scale),
        "overload": attrs.asdict(opts.overload) if opts.overload else None,
        "classes": [{"name": c.name, "about": c.about, "dir": c.name, "at_n": at_n_of(opts, c.name),
                     "model": Path(opts.sweeps[c.name].server.model.path).name,
                     "model_bytes": Path(opts.sweeps[c.name].server.model.path).stat().st_size,
                     "concurrency": list(opts.sweeps[c.name].concurrency),
                     "n_ctx": opts.sweeps[c.name].server.n_ctx, "wall_s": None,
                     "command": ["python", "-m", "bench.gate", *sys.argv[1:]]}
                    for c in opts.classes],
    }


def _merged(out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Keep the classes an earlier run into the same directory finished (a long matrix can run
    class by class: `--classes mla`, then `--classes iswa`, ...), in CLASSES order."""
    try:
        earlier = json.loads((out / MATRIX_JSON).read_text())["meta"]["classes"]
    except (OSError, ValueError, KeyError):
        return meta
    now = {e["name"] for e in meta["classes"]}
    kept = [e for e in earlier if e["name"] not in now and has_results(out / e["dir"])]
    order = {name: i for i, name in enumerate(CLASS_NAMES)}
    meta["classes"] = sorted(kept + meta["classes"], key=lambda e: order.get(e["name"], len(order)))
    return meta


def _write_json(out: Path, data: dict[str, Any]) -> None:
    tmp = out / (MATRIX_JSON + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out / MATRIX_JSON)


def earlier_matrix(out: Path, names: Sequence[str]) -> dict[str, Any]:
    """matrix.json of an earlier run whose classes `names` finished their closed loop: what a
    goodput-only run adds to (and keeps everything else of)."""
    try:
        data = json.loads((out / MATRIX_JSON).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench: --goodput-only needs an earlier matrix in {out}: {e}") from e
    have = {e["name"] for e in data["meta"]["classes"] if has_results(out / e["dir"])}
    if missing := [n for n in names if n not in have]:
        raise SystemExit(f"bench: --goodput-only: no closed-loop results for {', '.join(missing)} in {out}")
    return data


async def _class_runs(opts: MatrixOptions, c: GateClass, entry: dict[str, Any], save: Callable[[], None]) -> None:
    """One class: its sweep and overload run (unless goodput-only), then its goodput run."""
    sweep = opts.sweeps[c.name]
    print(f"bench: class {c.name}: {Path(sweep.server.model.path).name}", file=sys.stderr)
    if not opts.goodput_only:
        started = time.monotonic()
        await run_sweep(sweep)
        if opts.overload is not None:
            await run_sweep(overload_options(sweep, opts.overload))
        entry["wall_s"] = round(time.monotonic() - started, 1)
        save()
    if opts.goodput:
        await run_goodput(sweep, entry, opts.goodput, opts.at_n if opts.at_n is not None else entry["at_n"], save)


async def run_matrix(opts: MatrixOptions) -> dict[str, Any]:
    """Every class in turn: its sweep, its overload run, its goodput run, then matrix.json and
    summary.md again (an interrupted matrix keeps the classes it finished)."""
    opts.out.mkdir(parents=True, exist_ok=True)
    names = [c.name for c in opts.classes]
    data: dict[str, Any] = (earlier_matrix(opts.out, names) if opts.goodput_only
                            else {"meta": _merged(opts.out, _meta(opts)), "complete": False})
    _write_json(opts.out, data)
    entries = {e["name"]: e for e in data["meta"]["classes"]}
    for c in opts.classes:
        await _class_runs(opts, c, entries[c.name], lambda: _write_json(opts.out, data))
        write_matrix_report(opts.out)
    data["complete"] = data["complete"] or not opts.goodput_only  # goodput-only keeps the earlier state
    _write_json(opts.out, data)
    write_matrix_report(opts.out)
    return data
