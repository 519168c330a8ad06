"""The matrix's summary.md (one verdict row per class) and `check` on a matrix directory.

Verdicts are recomputed from the records every time (the sweep's own summaries are not
trusted), so `check` with other thresholds or `report` after a crash read the same evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from .engines import ABOUT, FAST, NEW, OLD, PEER, STOCK
from .gate import DEFAULTS, Thresholds, render
from .matrix_dir import GOODPUT_DIR, OVERLOAD_DIR, ClassData, engines_present, load_matrix
from .matrix_goodput import goodput_lines
from .metrics import Slo, run_summary
from .headroom import headrooms
from .verdict import ClassVerdict, SloScale, all_passed, class_verdict, ratio

SUMMARY = "summary.md"
GATE_TXT = "gate.txt"


def verdicts(data: dict[str, Any], classes: Sequence[ClassData], thresholds: Mapping[str, Thresholds] = DEFAULTS,
             slo_override: Slo | None = None, at_n: int | None = None,
             workloads: Sequence[str] | None = None) -> list[tuple[ClassData, ClassVerdict]]:
    meta = data["meta"]
    scale = SloScale(**meta["slo_scale"])
    lanes = (meta.get("overload") or {}).get("lanes", 0)
    return [(c, class_verdict(c.entry["name"], c.runs, c.overload, lanes, at_n or c.entry["at_n"], thresholds, scale,
                              slo_override, workloads, goodput_runs=c.goodput,
                              capacity=(c.entry.get("goodput") or {}).get("capacity"),
                              headrooms=headrooms(c.meta, c.batched, at_n or c.entry["at_n"]))) for c in classes]


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _ok(v: bool | None) -> str:
    return "–" if v is None else ("ok" if v else "FAIL")


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def _overload_cell(v: ClassVerdict) -> str:
    mine = [o for o in v.overload if o.engine == NEW]
    if not mine:
        return "not run"
    o = mine[0]
    return f"{'clean' if o.clean else 'FAIL'} ({o.ok}/{o.rejected}/{o.failed})"


def verdict_row(c: ClassData, v: ClassVerdict) -> str:
    checks = v.checks
    cells = [c.entry["name"], f"`{c.entry['model']}`", str(v.at_n)]
    cells += [_x(ratio(checks, NEW, ref, f"throughput@N={v.at_n}")) for ref in (OLD, PEER, STOCK)]
    cells += [_x(ratio(checks, NEW, ref, v.goodput_name)) for ref in (OLD, PEER, STOCK)]
    cells += [_x(ratio(checks, FAST, ref, f"throughput@N={v.at_n}")) for ref in (PEER, STOCK)]
    cells += [_ok(all_passed(checks, "p99 TTFT")), _ok(all_passed(checks, "N=1")), _overload_cell(v),
              f"{sum(k.passed for k in checks)}/{len(checks)}",
              "**PASS**" if v.passed else ("not run" if not c.runs else "**FAIL**")]
    return "| " + " | ".join(cells) + " |"


_VERDICT_HEAD = ("| class | model | N* | tok/s × single-lane | × llama-server | × stock | goodput × single-lane "
                 "| × llama-server | × stock | fast tok/s × llama-server | × stock | p99 TTFT | N=1 "
                 "| overload ok/429/failed | checks | verdict |")


def _slo_rows(c: ClassData, v: ClassVerdict, fixed: Slo) -> list[str]:
    rows = []
    for w, slo in v.slos.items():
        at = [r for r in c.runs if r.workload == w and r.load.kind == "closed" and r.load.n == v.at_n]
        good = ", ".join(f"{r.engine} {_g(run_summary(r, slo or Slo()).goodput)} / "
                         f"{_g(run_summary(r, fixed).goodput)}" for r in at) or "–"
        rows.append(f"| {c.entry['name']} | {w} | {_ms(slo and slo.ttft_ms)} | {_ms(slo and slo.tpot_ms)} | {good} |")
    return rows


def _g(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _memory_rows(c: ClassData, v: ClassVerdict) -> list[str]:
    rows = []
    for engine in dict.fromkeys(r.engine for r in c.runs):
        mine = [r for r in c.runs if r.engine == engine]
        rss = [x for r in mine if (x := r.server.get("peak_rss_mb")) is not None]
        at = [r for r in mine if r.load.kind == "closed" and r.load.n == v.at_n]
        kv = "; ".join(f"{r.workload}: " + ", ".join(f"{k} {b / 1024:.0f} KiB" for k, b in per.items())
                       for r in at if (per := r.server.get("kv_bytes_per_session"))) or "–"
        rows.append(f"| {c.entry['name']} | {engine} | {_ms(max(rss) if rss else None)} | {kv} |")
    return rows


def _overload_rows(c: ClassData, v: ClassVerdict) -> list[str]:
    return [f"| {c.entry['name']} | {o.engine} | {o.n} | {o.lanes} | {o.ok} | {o.rejected} | {o.failed} | "
            f"{'; '.join(o.errors) or '–'} |" for o in v.overload]


def _links(c: ClassData) -> str:
    name = c.entry["name"]
    base = Path(name)
    pngs = sorted({f"{r.workload}-closed.png" for r in c.runs})
    wall = c.entry.get("wall_s")
    good = c.entry.get("goodput") or {}
    parts = [f"[summary]({base / SUMMARY})", f"[checks]({base / GATE_TXT})",
             f"[overload]({base / OVERLOAD_DIR / SUMMARY})"]
    parts += [f"[goodput]({base / GOODPUT_DIR / SUMMARY})"] if good else []
    parts += [f"[{p}]({base / p})" for p in pngs]
    command = f"; `{' '.join(c.entry['command'])}`" if c.entry.get("command") else ""
    command += f"; goodput: `{' '.join(good['command'])}`" if good.get("command") else ""
    return (f"- **{name}** ({c.entry['about']}; `{c.entry['model']}`, N ∈ {c.entry['concurrency']}, "
            f"n_ctx {c.entry['n_ctx']}{'' if wall is None else f', {wall / 60:.1f} min'}{command}): "
            + " · ".join(parts))


def markdown(data: dict[str, Any], rows: Sequence[tuple[ClassData, ClassVerdict]]) -> str:
    meta = data["meta"]
    fixed = Slo(**meta["fixed_slo"])
    scale = SloScale(**meta["slo_scale"])
    over = meta.get("overload")
    fixed_text = ", ".join(f"{k.removesuffix('_ms')} ≤ {x:g} ms" for k, x in attrs.asdict(fixed).items()
                           if x is not None) or "none"
    lines = [
        f"# Cutover gate matrix ({meta['created']}{', quick: tiny synthetic models' if meta.get('quick') else ''})",
        "",
        f"Host {meta['host']['node']} ({meta['host']['cpus']} CPUs); commit {str(meta.get('git_commit'))[:10]}"
        f"{'' if data.get('complete') else '; **incomplete** (classes without runs read not run)'}.",
        "Engines: " + "; ".join(f"{e} = {ABOUT.get(e, e)}"
                                for e in engines_present([c for c, _ in rows]) or meta["engines"]) + ".",
        "",
        f"Command: `{' '.join(meta['command'])}`",
        "",
        f"**SLO.** Verdicts use an SLO scaled to this hardware: {scale.rule()}. The seed's fixed SLO "
        f"({fixed_text}) is reported beside it (goodput columns below: scaled / fixed).",
        "",
        "**Verdict.** PASS when, on every closed-loop workload at N*, skippy's throughput is ≥ "
        f"{DEFAULTS[OLD].throughput_ratio:g}× single-lane's and ≥ {DEFAULTS[PEER].throughput_ratio:g}× both "
        "llama-servers', its goodput ≥ 1× each (open-loop Poisson at the highest rate of the goodput run where the "
        "class has one, else closed loop at N*), its p99 TTFT no worse, its N=1 throughput within 5% and its curve "
        "no lower at any N, it fails no request, skippy-fast passes the same against both llama-servers, and the "
        "overload run is clean (every request answered or refused with 429: zero failures). Ratios: the worst "
        "workload's new / reference at N*; `python -m bench.gate check DIR` prints every check and takes other "
        "thresholds.",
        "",
        "## Verdicts", "", _VERDICT_HEAD, "|" + "---|" * (_VERDICT_HEAD.count("|") - 1),
    ]
    lines += [verdict_row(c, v) for c, v in rows]
    lines += ["", "## SLOs and goodput at N* (req/s, scaled / fixed SLO)", "",
              "| class | workload | scaled TTFT ms | scaled TPOT ms | goodput per engine |", "|---|---|---|---|---|"]
    lines += [row for c, v in rows for row in _slo_rows(c, v, fixed)]
    lines += goodput_lines(rows, fixed)
    lines += ["", "## Memory: peak RSS (max over runs) and skippy's KV bytes per running session at N*", "",
              "| class | engine | peak RSS MiB | KV per session |", "|---|---|---|---|"]
    lines += [row for c, v in rows for row in _memory_rows(c, v)]
    if over:
        lines += ["", f"## Overload: N={over['n']} closed-loop workers, skippy `--n-seq-max {over['lanes']} "
                  f"--max-waiting {over['waiting']}` (429 past that), llama-server `-np {over['lanes']}` "
                  "(queues without bound); chat", "",
                  "| class | engine | N | lanes | ok | 429 | failed | errors |", "|---|---|---|---|---|---|---|---|"]
        lines += [row for c, v in rows for row in _overload_rows(c, v)]
    lines += ["", "## Per class", ""] + [_links(c) for c, _ in rows]
    lines += ["", "## Server command lines (per class)", ""]
    for c, _ in rows:
        for engine, argv in ((c.meta or {}).get("argv") or {}).items():
            lines.append(f"- {c.entry['name']} / {engine}: `{' '.join(argv)}`")
    return "\n".join(lines) + "\n"


def check_text(rows: Sequence[tuple[ClassData, ClassVerdict]]) -> str:
    """What `check` prints: per class its verdict, every check, and the overload counts."""
    out = []
    for c, v in rows:
        state = "PASS" if v.passed else ("NOT RUN" if not c.runs else "FAIL")
        out.append(f"=== {c.entry['name']}: {state} ({c.entry['model']}, N*={v.at_n})")
        if c.runs:
            out += ["  " + line for line in render(v.checks).splitlines()]
        for o in v.overload:
            out.append(f"  overload {o.engine}: N={o.n} lanes={o.lanes} ok={o.ok} 429={o.rejected} "
                       f"failed={o.failed} -> {'clean' if o.clean else 'FAIL'}"
                       + (f" ({'; '.join(o.errors)})" if o.errors else ""))
        if v.overload_clean is None:
            out.append("  overload: not run (FAIL: absent evidence)")
        if good := c.entry.get("goodput"):
            out.append(f"  goodput: capacity {good['capacity']:.3g} req/s ({good['workload']}, N={good['at_n']}); "
                       f"Poisson at {', '.join(f'{r:g}' for r in good['rates'])} req/s "
                       f"({', '.join(f'{f:g}' for f in good['fractions'])} x capacity)"
                       + ("" if c.goodput else ": not run"))
    return "\n".join(out)


def write_matrix_report(path: Path, thresholds: Mapping[str, Thresholds] = DEFAULTS,
                        slo_override: Slo | None = None) -> Path:
    """summary.md at the top and gate.txt in every class that ran."""
    data, classes = load_matrix(path)
    rows = verdicts(data, classes, thresholds, slo_override)
    for c, v in rows:
        if c.runs:
            (path / c.entry["dir"] / GATE_TXT).write_text(check_text([(c, v)]) + "\n")
    (path / SUMMARY).write_text(markdown(data, rows))
    return path / SUMMARY
