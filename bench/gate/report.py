"""Writing and reading a results directory: results.json (every request), summary.md, plots.

results.json holds the raw records; each run's summary is derived from them with the sweep's
SLO and stored beside them for convenience, but readers (the gate, `report`) recompute from
the records so a different SLO can be applied afterwards.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import attrs

from .engines import ABOUT
from .metrics import Slo, Summary, run_summary
from .plots import write_plots
from .records import RunResult

RESULTS = "results.json"
PACKED = RESULTS + ".gz"
SUMMARY = "summary.md"


def _clean(x: Any) -> Any:
    """JSON without NaN/inf (strict parsers reject them); floats to 6 decimals (times are seconds:
    a microsecond is past any clock this measures with, and the file stays a fraction of the size)."""
    if isinstance(x, float):
        return round(x, 6) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def dump_results(results: dict[str, Any]) -> str:
    """results.json's text: each top-level list (runs, batched-bench entries) one element per line,
    compact, the rest indented. One value per line made a 3-engine sweep's per-token gaps 5 MB."""
    parts = []
    for key, value in _clean(results).items():
        if isinstance(value, list):
            body = ",\n".join(json.dumps(v, separators=(",", ":")) for v in value)
            parts.append(f"{json.dumps(key)}: [\n{body}\n]" if value else f"{json.dumps(key)}: []")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value, indent=1)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_results(out: Path, results: dict[str, Any], runs: Sequence[RunResult], slo: Slo, final: bool) -> None:
    """results.json always; summary.md and the plots once the sweep is complete."""
    results["runs"] = [{**r.to_json(), "summary": attrs.asdict(run_summary(r, slo))} for r in runs]
    results["complete"] = final
    tmp = out / (RESULTS + ".tmp")
    tmp.write_text(dump_results(results))
    tmp.replace(out / RESULTS)
    if final:
        write_report(out, results["meta"], runs, results.get("batched_bench", []), slo)


def results_file(path: Path) -> Path | None:
    """A directory's results.json, or its packed form (results.json.gz: how a committed run stays
    small; a sweep writes the plain file, `pack` compresses it); None when it has neither."""
    if not path.is_dir():
        return path if path.exists() else None
    return next((f for f in (path / RESULTS, path / PACKED) if f.exists()), None)


def has_results(path: Path) -> bool:
    return results_file(path) is not None


def read_results(path: Path) -> dict[str, Any]:
    """The parsed results.json of a directory (plain or packed), or of a results.json(.gz) path."""
    file = results_file(path)
    if file is None:
        raise FileNotFoundError(f"no {RESULTS} or {PACKED} in {path}")
    raw = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
    return json.loads(raw)


def load_results(path: Path) -> tuple[dict[str, Any], list[RunResult], list[dict[str, Any]]]:
    """(meta, runs, batched-bench entries) of a results directory (or a results.json path)."""
    data = read_results(path)
    return data["meta"], [RunResult.from_json(r) for r in data["runs"]], data.get("batched_bench", [])


def pack(root: Path, min_bytes: int = 0) -> list[Path]:
    """Compress each complete results.json under `root` of at least `min_bytes` into results.json.gz
    (mtime 0, so packing again gives the same bytes); an incomplete one stays plain so its sweep can
    still resume. Returns the packed files."""
    done = []
    for plain in sorted(root.rglob(RESULTS)):
        raw = plain.read_bytes()
        if len(raw) < min_bytes or not json.loads(raw).get("complete", True):
            continue
        packed = plain.with_name(PACKED)
        packed.write_bytes(gzip.compress(raw, 9, mtime=0))
        plain.unlink()
        done.append(packed)
    return done


def slo_of(meta: dict[str, Any]) -> Slo:
    return Slo(**meta.get("slo", {}))


def write_report(out: Path, meta: dict[str, Any], runs: Sequence[RunResult], batched: list[dict[str, Any]],
                 slo: Slo) -> None:
    (out / SUMMARY).write_text(markdown(meta, runs, batched, slo))
    shapes = {w["name"]: (w["input_len"], w["output_len"]) for w in meta.get("workloads", [])}
    write_plots(out, runs, batched, slo, shapes)


def _f(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _kv(run: RunResult) -> str:
    per = run.server.get("kv_cells_per_session") or {}
    return ", ".join(f"{c} {_f(v.get('mean'), 0)}" for c, v in per.items() if v.get("mean") is not None) or "–"


_HEAD = ("| load | engine | ok | failed | out tok/s | req/s | goodput | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 "
         "| ITL p99 | E2E p99 | prefix hit | cached/prompt | KV cells/session | step overhead | peak RSS MiB |")


def _row(run: RunResult, s: Summary) -> str:
    cells = [run.load.label, run.engine, str(s.completed), str(s.failed), _f(s.out_tok_per_s), _f(s.req_per_s, 2),
             _f(s.goodput, 2), _f(s.ttft_p50_ms, 0), _f(s.ttft_p99_ms, 0), _f(s.tpot_p50_ms), _f(s.tpot_p99_ms),
             _f(s.itl_p99_ms), _f(s.e2e_p99_ms, 0), _pct(run.server.get("prefix_hit_rate")),
             _pct(s.cached_token_ratio), _kv(run), _f(run.server.get("step_overhead_ratio"), 2),
             _f(run.server.get("peak_rss_mb"), 0)]
    return "| " + " | ".join(cells) + " |"


def _sampling_text(run: dict) -> str:
    fields = {"temperature": run.get("temperature", 0.0), **(run.get("sampling") or {})}
    if not fields["temperature"]:
        return "greedy (temperature 0) in every engine"
    return "every request sends " + ", ".join(f"{k} {v}" for k, v in fields.items()) + " (and its seed)"


def _workload_line(meta: dict[str, Any], name: str) -> str:
    for w in meta.get("workloads", []):
        if w["name"] == name:
            shared = f", shared system prompt {w['shared_len']}" if w["shared_len"] else ", unique prompts"
            docs = (f" ({w['doc_share']:.0%} of them {w['doc_len']}-token documents)"
                    if w.get("doc_len") else "")
            return f"{w['input_len']} prompt tokens{docs}, {w['output_len']} output tokens{shared}"
    return ""


def markdown(meta: dict[str, Any], runs: Sequence[RunResult], batched: list[dict[str, Any]], slo: Slo) -> str:
    m, srv = meta["model"], meta["server"]
    slo_text = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in attrs.asdict(slo).items()
                         if v is not None) or "none (goodput not computed)"
    lines = [
        f"# Gate sweep ({meta['created']})",
        "",
        f"Model `{Path(m['path']).name}`; threads {srv['threads']}, n_ctx {srv['n_ctx']} (one shared pool), "
        f"n_batch {srv['n_batch']}; host {meta['host']['node']} ({meta['host']['cpus']} CPUs, {meta['host'].get('isa', 'ISA not recorded')}); "
        f"commit {str(meta.get('git_commit'))[:10]}.",
        f"SLO: {slo_text}. Latencies in ms; warm-up ({meta['run']['warmup']} requests per run) excluded. "
        "TPOT = (E2E − TTFT)/(output tokens − 1) per request; ITL pooled over requests; goodput = req/s meeting "
        "every SLO. Prefix hit: skippy's prefix-cache counters over the run; cached/prompt: "
        "`usage.prompt_tokens_details.cached_tokens` / prompt tokens as the server reports them; KV cells per "
        "running session: skippy's /metrics, sampled. Step overhead: the share of skippy's busy step time "
        "outside the decode over the run (`skippy_step_busy_seconds` / `skippy_step_decode_seconds` deltas, "
        "else the mean of the sampled `skippy_step_overhead_ratio`), – where the server does not expose it.",
        "",
        "Engines: " + "; ".join(f"{e} = {ABOUT.get(e, e)}" for e in meta.get("engines", [])) + ".",
        "",
        f"Command: `{' '.join(meta['command'])}`",
        "",
        f"Sampling: {_sampling_text(meta.get('run', {}))}.",
        "",
    ]
    if (meta.get("rounds") or 1) > 1:
        where = "every load" if meta.get("rounds_up_to") is None else f"closed loads with N ≤ {meta['rounds_up_to']}"
        lines += [f"Rounds: at {where}, each engine's block ran {meta['rounds']} times, engines in alternating "
                  "order (A B C, C B A, ...); each row pools its rounds' requests and time.", ""]
    for workload in dict.fromkeys(r.workload for r in runs):
        lines += [f"## {workload}: {_workload_line(meta, workload)}", "", _HEAD,
                  "|" + "---|" * (_HEAD.count("|") - 1)]
        for run in sorted((r for r in runs if r.workload == workload), key=lambda r: (r.load.kind, r.load.x)):
            lines.append(_row(run, run_summary(run, slo)))
        lines.append("")
    if batched:
        lines += ["## llama-batched-bench (raw hardware reference, unified KV)", "",
                  "| prompt | gen | B | prompt tok/s | decode tok/s | total tok/s |", "|---|---|---|---|---|---|"]
        for entry in batched:
            for row in entry.get("rows", []):
                lines.append(f"| {row['pp']} | {row['tg']} | {row['pl']} | {_f(row['speed_pp'])} | "
                             f"{_f(row['speed_tg'])} | {_f(row['speed'])} |")
            if entry.get("error"):
                lines.append(f"| {entry['pp']} | {entry['tg']} | – | error: {entry['error']} | | |")
        lines.append("")
    lines += ["## Server command lines", ""] + [f"- {e}: `{' '.join(a)}`" for e, a in meta.get("argv", {}).items()]
    return "\n".join(lines) + "\n"


def summaries(runs: Iterable[RunResult], slo: Slo) -> dict[tuple[str, str, str, float], Summary]:
    """(engine, workload, load kind, x) -> summary: what the gate and the plots index by."""
    return {(r.engine, r.workload, r.load.kind, r.load.x): run_summary(r, slo) for r in runs}
