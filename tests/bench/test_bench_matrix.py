"""The matrix's pure parts: the scaled SLO, overload counts, class verdicts, options and the
summary's rows, on hand-made records (no server)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import pytest

from bench.gate.cli import _parser
from bench.gate.gate import DEFAULTS
from bench.gate.matrix import CLASS_NAMES, OverloadPlan, auto_n_ctx, overload_options, run_matrix
from bench.gate.matrix_cli import matrix_options
from bench.gate.matrix_dir import MATRIX_JSON, load_matrix
from bench.gate.matrix_goodput import GoodputPlan, capacity, goodput_options, goodput_plan, goodput_rates
from bench.gate.matrix_report import check_text, verdicts, write_matrix_report
from bench.gate.metrics import Slo
from bench.gate.model import ModelSpec
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


def test_the_full_matrix_runs_the_prompt_heavy_workloads_too():
    """rag (1024 in) and rag512 join every class's sweep, and the pool holds N=64 of the longest."""
    opts = matrix_options(_parser().parse_args(["matrix", "--classes", "dense", "ssm-hybrid", "--out-dir", "/tmp/x"]))
    for sweep in opts.sweeps.values():
        names = [w.name for w in sweep.workloads]
        assert names == ["chat", "gen", "chat-shared", "rag512", "rag"]
        rag = next(w for w in sweep.workloads if w.name == "rag")
        assert rag.max_input_len >= 1024
        assert sweep.server.n_ctx >= 64 * (rag.max_input_len + rag.output_len)


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


# goodput: open-loop Poisson at fractions of each class's capacity (bench/gate/matrix_goodput.py)

def poisson(engine: str, rate: float, ttft: float, count: int = 4) -> RunResult:
    """`count` requests in 1 s at `rate` req/s; each within the scaled SLO of _class_runs unless ttft > 1 s."""
    return RunResult(engine, "chat", Load.poisson(rate), 1.0, [rec(i, ttft, 0.01) for i in range(count)], {})


def test_capacity_is_the_median_closed_loop_req_s_but_single_lane():
    runs = [run("skippy", 4, 0.1, 0.01, duration=1.0), run("llama-server", 4, 0.1, 0.01, duration=2.0),
            run("llama-server-stock", 4, 0.1, 0.01, duration=0.5), run("single-lane", 4, 0.1, 0.01, duration=0.1),
            run("skippy", 1, 0.1, 0.01, duration=0.01), run("skippy", 4, 0.1, 0.01, workload="gen", duration=0.01)]
    assert capacity(runs, "chat", 4) == pytest.approx(4.0)  # 4, 2 and 8 req/s; single-lane, N=1 and gen left out
    plan = goodput_plan(runs, "chat", 4, (0.5, 0.8, 1.0))
    assert plan is not None and plan.rates == (2.0, 3.2, 4.0) and plan.capacity == pytest.approx(4.0)
    assert GoodputPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert goodput_rates(1 / 3, (1.0,)) == (0.3333,)  # 4 significant digits
    assert goodput_plan(runs, "chat", 32, (1.0,)) is None  # no closed-loop run at N* to measure


def test_goodput_options_run_every_engine_on_chat_at_the_rates():
    argv = ["matrix", "--quick", "--classes", "dense", "--engines", "skippy", "single-lane", "llama-server",
            "--out-dir", "/tmp/x"]
    opts = matrix_options(_parser().parse_args(argv))
    assert opts.goodput == (1.0,) and not opts.goodput_only  # quick: one rate, at capacity
    good = goodput_options(opts.sweeps["dense"], (1.5, 3.0))
    assert good.engines == ("skippy", "single-lane", "llama-server") and [w.name for w in good.workloads] == ["chat"]
    assert good.loads == [Load.poisson(1.5), Load.poisson(3.0)] and good.slots is None and not good.batched_bench
    assert good.out == Path("/tmp/x/matrix-quick/dense/goodput")
    assert matrix_options(_parser().parse_args(argv + ["--goodput-fractions", "0.5", "1"])).goodput == (0.5, 1.0)
    assert matrix_options(_parser().parse_args(argv + ["--no-goodput"])).goodput == ()
    with pytest.raises(SystemExit):
        _parser().parse_args(argv + ["--no-goodput", "--goodput-only"])


def test_poisson_goodput_at_the_highest_rate_replaces_the_closed_loop_check():
    def verdict(good: list[RunResult], cap: float | None = 2.0):
        return class_verdict("dense", _class_runs(3.0), [run("skippy", 8, 0.1, 0.01)], 2, 4, DEFAULTS, SloScale(),
                             goodput_runs=good, capacity=cap)

    refs = [poisson(e, r, 0.1) for e in ("single-lane", "llama-server") for r in (1.0, 2.0)]
    # skippy misses the SLO at 1 req/s: goodput is judged at the top rate only, p99 TTFT at every rate <= 1x
    late = verdict([poisson("skippy", 1.0, 5.0), poisson("skippy", 2.0, 0.1)] + refs)
    assert {c.name for c in late.checks if not c.passed} == {"p99 TTFT@0.5x capacity"}
    assert {c.reference for c in late.checks if c.name.endswith("x capacity") and "TTFT" in c.name} == {"llama-server"}
    good = verdict([poisson("skippy", 1.0, 0.1), poisson("skippy", 2.0, 0.1)] + refs)
    names = {c.name for c in good.checks}
    assert good.passed and good.goodput_name == "goodput@1x capacity" and "goodput@N=4" not in names
    assert {"p99 TTFT@0.5x capacity", "p99 TTFT@1x capacity"} <= names
    past = verdict([poisson("skippy", 3.0, 0.1), poisson("llama-server", 3.0, 0.1), poisson("skippy", 2.0, 0.1),
                    poisson("llama-server", 2.0, 0.1), poisson("single-lane", 3.0, 0.1)])
    assert "p99 TTFT@1.5x capacity" not in {c.name for c in past.checks}  # past capacity: goodput alone
    assert [(c.reference, c.new, c.ref) for c in good.checks if c.name == good.goodput_name] == [
        ("single-lane", 4.0, 4.0), ("llama-server", 4.0, 4.0)]
    slow = verdict([poisson("skippy", 1.0, 0.1), poisson("skippy", 2.0, 5.0)] + refs)  # TTFT past the 1 s SLO
    assert not slow.passed and {c.reference for c in slow.checks if not c.passed} == {"single-lane", "llama-server"}
    zero = verdict([poisson(e, 2.0, 5.0) for e in ("skippy", "single-lane", "llama-server")])
    assert zero.passed  # 0 against 0 passes, as the closed-loop ratio checks do
    missing = verdict([poisson("single-lane", 2.0, 0.1), poisson("llama-server", 2.0, 0.1)])
    assert not missing.passed  # skippy never ran at the top rate: absent evidence fails
    assert verdict([poisson("skippy", 2.0, 0.1)], cap=None).goodput_name == "goodput@2 req/s"
    closed = verdict([])
    assert closed.goodput_name == "goodput@N=4" and "goodput@N=4" in {c.name for c in closed.checks}


def _matrix_dir(path: Path, model: str) -> None:
    """An earlier matrix: dense measured (closed loop and overload), the other classes never ran."""
    entry = {"about": "a", "at_n": 4, "model": model, "model_bytes": 1, "concurrency": [1, 4], "n_ctx": 1024,
             "wall_s": 12.0, "command": ["earlier"]}
    meta = {"classes": [{**entry, "name": n, "dir": n} for n in CLASS_NAMES], "created": "then",
            "command": ["earlier"], "git_commit": None, "host": {"node": "h", "cpus": 2}, "quick": True,
            "engines": ["skippy", "single-lane", "llama-server"], "fixed_slo": {"ttft_ms": 2000.0, "tpot_ms": 200.0},
            "slo_scale": {"ttft_x": 10.0, "tpot_x": 5.0}, "overload": {"n": 8, "lanes": 2, "waiting": 2}}
    (path / MATRIX_JSON).write_text(json.dumps({"meta": meta, "complete": True}))
    swept = {"engines": ["skippy", "single-lane", "llama-server"], "server": {"n_ctx": 2048, "threads": 1},
             "workloads": [attrs.asdict(make_workload("chat"))], "model": {"path": f"/models/{model}"}}
    for sub, runs in (("", _class_runs(3.0)), ("overload", [run("skippy", 8, 0.1, 0.01)])):
        (path / "dense" / sub).mkdir(parents=True, exist_ok=True)
        write_results(path / "dense" / sub, {"meta": swept}, runs, Slo(), final=False)


async def test_goodput_only_adds_goodput_and_keeps_the_earlier_matrix(tmp_path: Path, monkeypatch):
    from bench.gate import matrix, matrix_goodput

    out = tmp_path / "m"
    out.mkdir()
    _matrix_dir(out, ModelSpec.resolve(None, "llama").path.name)
    ran = []

    async def fake_sweep(opts):  # every engine within the SLO at every rate
        ran.append(opts)
        opts.out.mkdir(parents=True)
        runs = [poisson(e, r, 0.1) for r in opts.rates for e in opts.engines]
        write_results(opts.out, {"meta": {}}, runs, Slo(), final=False)

    monkeypatch.setattr(matrix_goodput, "run_sweep", fake_sweep)
    monkeypatch.setattr(matrix, "run_sweep", None)  # the closed loop and overload must not rerun
    argv = ["matrix", "--quick", "--out-dir", str(tmp_path), "--name", "m", "--classes", "dense", "--goodput-only",
            "--goodput-fractions", "0.5", "1"]
    monkeypatch.setattr(sys, "argv", ["python", *argv])  # the command recorded in matrix.json
    opts = matrix_options(_parser().parse_args(argv))
    assert opts.sweeps["dense"].engines == ("skippy", "single-lane", "llama-server")  # as the closed loop ran
    assert (opts.sweeps["dense"].server.n_ctx, opts.sweeps["dense"].server.threads) == (2048, 1)
    await run_matrix(opts)
    assert [o.rates for o in ran] == [(4.0, 8.0)]  # capacity: the median of 12 (skippy) and 4 (llama-server) req/s
    data = json.loads((out / MATRIX_JSON).read_text())
    dense = data["meta"]["classes"][0]
    assert (dense["wall_s"], dense["command"], data["meta"]["created"], data["complete"]) == (12.0, ["earlier"],
                                                                                            "then", True)
    assert dense["goodput"]["fractions"] == [0.5, 1.0] and "--goodput-only" in dense["goodput"]["command"]
    assert [c["name"] for c in data["meta"]["classes"]] == list(CLASS_NAMES)
    summary = (out / "summary.md").read_text()
    assert "## Goodput" in summary and "(dense/goodput/summary.md)" in summary
    assert "goodput@1x capacity" in check_text(verdicts(*load_matrix(out)))
    with pytest.raises(SystemExit):  # mla never measured its closed loop
        matrix_options(_parser().parse_args(argv[:-5] + ["mla", "--goodput-only"]))
