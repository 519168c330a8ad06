"""The matrix's pure parts: the scaled SLO, overload counts, class verdicts, options and the
summary's rows, on hand-made records (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gate.cli import _parser
from bench.gate.gate import DEFAULTS
from bench.gate.matrix import (
    CLASS_NAMES,
    MATRIX_JSON,
    OverloadPlan,
    auto_n_ctx,
    load_matrix,
    overload_options,
)
from bench.gate.matrix_cli import matrix_options
from bench.gate.matrix_report import check_text, verdicts, write_matrix_report
from bench.gate.metrics import Slo
from bench.gate.records import Load, RequestRecord, RunResult
from bench.gate.report import write_results
from bench.gate.verdict import SloScale, class_verdict, overload_counts, scaled_slo
from bench.gate.workloads import make_workload

pytestmark = pytest.mark.bench


def rec(i: int, ttft: float, tpot: float, n: int = 5, error: str | None = None) -> RequestRecord:
    return RequestRecord(index=i, warmup=False, t_send=0.0, ttft=ttft, e2e=ttft + tpot * (n - 1),
                         itl=[tpot] * (n - 1), prompt_tokens=8, output_tokens=n, error=error)


def run(engine: str, n: int, ttft: float, tpot: float, count: int = 4, workload: str = "chat",
        duration: float = 1.0, errors: tuple[str | None, ...] = ()) -> RunResult:
    reqs = [rec(i, ttft, tpot, error=errors[i] if i < len(errors) else None) for i in range(count)]
    return RunResult(engine, workload, Load.closed(n), duration, reqs, {"peak_rss_mb": 100.0})


def test_scaled_slo_is_a_multiple_of_the_engines_median_n1_p50():
    runs = [run("skippy", 1, 0.1, 0.01), run("llama-server", 1, 0.3, 0.03), run("single-lane", 1, 0.2, 0.02),
            run("skippy", 4, 9.0, 0.9)]  # N=4 does not set the bar
    slo = scaled_slo(runs, "chat", SloScale(ttft_x=10, tpot_x=5))
    assert slo is not None and slo.ttft_ms == pytest.approx(2000) and slo.tpot_ms == pytest.approx(100)
    assert scaled_slo(runs, "gen", SloScale()) is None  # no N=1 run of that workload


def test_overload_counts_429_apart_from_failures():
    r = run("skippy", 8, 0.1, 0.01, count=5, errors=(None, "HTTP 429: queue full", "HTTP 500: boom", None,
                                                      "HTTP 429: queue full"))
    o = overload_counts(r, lanes=2)
    assert (o.ok, o.rejected, o.failed, o.n, o.lanes) == (2, 2, 1, 8, 2) and not o.clean
    assert o.errors == ("HTTP 500: boom",)
    assert overload_counts(run("skippy", 8, 0.1, 0.01), 2).clean


def _class_runs(new_tok_scale: float) -> list[RunResult]:
    """skippy at N=4 finishes 4 requests in 1/new_tok_scale s; the references take 1 s."""
    return [run("skippy", 1, 0.1, 0.01), run("single-lane", 1, 0.1, 0.01), run("llama-server", 1, 0.1, 0.01),
            run("skippy", 4, 0.1, 0.01, duration=1 / new_tok_scale), run("single-lane", 4, 0.1, 0.01, duration=1.0),
            run("llama-server", 4, 0.1, 0.01, duration=1.0)]


def test_class_verdict_needs_every_check_and_a_clean_overload():
    clean = [run("skippy", 8, 0.1, 0.01, errors=(None, "HTTP 429: full"))]
    good = class_verdict("dense", _class_runs(3.0), clean, 2, 4, DEFAULTS, SloScale())
    slo = good.slos["chat"]
    assert good.passed and good.overload_clean and slo is not None
    assert (slo.ttft_ms, slo.tpot_ms) == (pytest.approx(1000.0), pytest.approx(50.0))
    slow = class_verdict("dense", _class_runs(1.5), clean, 2, 4, DEFAULTS, SloScale())  # < 2x single-lane
    assert not slow.passed and any(not c.passed and c.reference == "single-lane" for c in slow.checks)
    failed = [run("skippy", 8, 0.1, 0.01, errors=("HTTP 500: decode failed",))]
    assert not class_verdict("dense", _class_runs(3.0), failed, 2, 4, DEFAULTS, SloScale()).passed
    no_overload = class_verdict("dense", _class_runs(3.0), [], 2, 4, DEFAULTS, SloScale())
    assert no_overload.overload_clean is None and not no_overload.passed  # absent evidence fails


def test_overload_options_cap_lanes_and_queue():
    argv = ["matrix", "--quick", "--classes", "dense", "mla", "--class-n", "mla=1,2", "--out-dir", "/tmp/x"]
    opts = matrix_options(_parser().parse_args(argv))
    assert [c.name for c in opts.classes] == ["dense", "mla"] and opts.sweeps["mla"].concurrency == (1, 2)
    assert opts.sweeps["dense"].concurrency == (1, 4) and opts.sweeps["dense"].out == Path("/tmp/x/matrix-quick/dense")
    assert [w.name for w in opts.sweeps["dense"].workloads] == ["chat", "gen", "chat-shared"]
    assert opts.sweeps["dense"].engines == ("skippy", "llama-server") and opts.overload == OverloadPlan(8, 2, 2)
    over = overload_options(opts.sweeps["dense"], opts.overload)
    assert over.slots == 2 and over.concurrency == (8,) and [w.name for w in over.workloads] == ["chat"]
    assert over.server.skippy_extra[-4:] == ("--n-seq-max", "2", "--max-waiting", "2")
    assert over.out == Path("/tmp/x/matrix-quick/dense/overload")
    with pytest.raises(SystemExit):
        matrix_options(_parser().parse_args(["matrix", "--quick", "--class-n", "nope=1"]))


def test_auto_n_ctx_holds_the_largest_n_at_full_length():
    ws = [make_workload("chat"), make_workload("gen")]  # 128+64, 128+512
    assert auto_n_ctx([1, 64], ws, 4096) == 64 * 640
    assert auto_n_ctx([1, 2], ws, 4096) == 4096


def test_summary_has_a_row_per_class_and_check_reads_it(tmp_path: Path):
    meta = {"classes": [{"name": n, "about": n, "dir": n, "at_n": 4, "model": f"{n}.gguf", "model_bytes": 1,
                         "concurrency": [1, 4], "n_ctx": 1024, "wall_s": 1.0} for n in CLASS_NAMES],
            "created": "now", "command": ["python", "-m", "bench.gate", "matrix"], "git_commit": None,
            "host": {"node": "h", "cpus": 2}, "quick": True, "engines": ["skippy", "single-lane", "llama-server"],
            "fixed_slo": {"ttft_ms": 2000.0, "tpot_ms": 200.0, "e2e_ms": None},
            "slo_scale": {"ttft_x": 10.0, "tpot_x": 5.0}, "overload": {"n": 8, "lanes": 2, "waiting": 2}}
    (tmp_path / MATRIX_JSON).write_text(json.dumps({"meta": meta, "complete": False}))
    for name in CLASS_NAMES[:-1]:  # the last class never ran
        for sub, runs in (("", _class_runs(3.0)), ("overload", [run("skippy", 8, 0.1, 0.01)])):
            out = tmp_path / name / sub
            out.mkdir(parents=True, exist_ok=True)
            write_results(out, {"meta": {}}, runs, Slo(), final=False)
    summary = write_matrix_report(tmp_path).read_text()
    rows = [line for line in summary.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    assert [r.split("|")[1].strip() for r in rows] == list(CLASS_NAMES)
    assert all(r.rstrip(" |").endswith("**PASS**") for r in rows[:-1]) and rows[-1].rstrip(" |").endswith("not run")
    assert "3.00×" in rows[0] and "clean (4/0/0)" in rows[0]
    assert "TTFT ≤ 10 × and TPOT ≤ 5 ×" in summary and "ttft ≤ 2000 ms" in summary
    text = check_text(verdicts(*load_matrix(tmp_path)))
    assert "=== dense: PASS" in text and f"=== {CLASS_NAMES[-1]}: NOT RUN" in text
    assert (tmp_path / "dense" / "gate.txt").read_text().startswith("=== dense: PASS")


def test_a_later_run_keeps_the_classes_it_does_not_rerun(tmp_path: Path):
    from bench.gate.matrix import _merged

    def entry(name: str) -> dict:
        return {"name": name, "dir": name, "command": [name]}

    (tmp_path / MATRIX_JSON).write_text(json.dumps({"meta": {"classes": [entry("mla"), entry("dense"),
                                                                         entry("iswa")]}}))
    for name in ("mla", "dense"):  # iswa never finished: not kept
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text("{}")
    meta = _merged(tmp_path, {"classes": [{**entry("dense"), "command": ["again"]}, entry("ssm-hybrid")]})
    assert [(e["name"], e["command"]) for e in meta["classes"]] == [
        ("dense", ["again"]), ("mla", ["mla"]), ("ssm-hybrid", ["ssm-hybrid"])]


def test_kv_bytes_per_session_and_rejections_from_metrics():
    from bench.gate.prom import parse_scrape
    from bench.gate.runner import kv_bytes_per_session

    s = parse_scrape('skippy_kv_bytes_per_cell{component="attn"} 1024\n'
                     'skippy_kv_bytes_per_cell{component="recurrent"} 4096\n'
                     '# TYPE skippy_queue_rejections counter\nskippy_queue_rejections_total 3\n')
    assert s.kv_bytes_per_cell == {"attn": 1024.0, "recurrent": 4096.0} and s.rejections == 3.0
    cells = {"attn": {"mean": 10.0, "max": 12.0}, "recurrent": {"mean": 1.0}, "swa": {"mean": None}}
    assert kv_bytes_per_session(cells, s.kv_bytes_per_cell) == {"attn": 10240.0, "recurrent": 4096.0}
