"""The matrix end to end so the harness cannot rot: `python -m bench.gate matrix --quick` runs
skippy and llama-server on every class's tiny synthetic model (real servers, real HTTP, the
three workloads, an overload run, a goodput run), writes one verdict row per class; `check` then prints a
verdict per class and `report` redraws the summary."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from _stop import stop_gently  # noqa: E402 (tests/bench is on sys.path: no package here)

from bench.gate.matrix import CLASS_NAMES

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]

BUILD_BUDGET_S = 1200  # a fresh machine builds llama-server first (~4 min here)
MATRIX_BUDGET_S = 300  # ~30 s on an idle 2-core machine; the budget only guards against a hang
LENIENT = ["--vs-single-lane-throughput", "0", "--vs-single-lane-goodput", "0", "--vs-llama-throughput", "0",
           "--vs-llama-goodput", "0", "--p99-ttft-slack", "1e9", "--n1-tolerance", "1"]


async def bench(*args: str, budget: float) -> trio.CompletedProcess:
    with trio.fail_after(budget):
        return await trio.run_process([sys.executable, "-m", "bench.gate", *args], cwd=REPO, check=False,
                                      capture_stdout=True, capture_stderr=True, deliver_cancel=stop_gently)


@pytest.fixture
async def matrix_results(tmp_path: Path) -> Path:
    from skippy.native import ensure_built

    with trio.fail_after(BUILD_BUDGET_S):
        await trio.to_thread.run_sync(partial(ensure_built, tools=True, progress=False), abandon_on_cancel=True)
    done = await bench("matrix", "--quick", "--out-dir", str(tmp_path), "--quiet", budget=MATRIX_BUDGET_S)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return tmp_path / "matrix-quick"


async def test_quick_matrix_has_a_verdict_per_class(matrix_results: Path):
    data = json.loads((matrix_results / "matrix.json").read_text())
    assert data["complete"] and [c["name"] for c in data["meta"]["classes"]] == list(CLASS_NAMES)
    summary = (matrix_results / "summary.md").read_text()
    for name in CLASS_NAMES:
        row = next(line for line in summary.splitlines() if line.startswith(f"| {name} | `"))
        assert row.rstrip(" |").endswith(("**PASS**", "**FAIL**")), row  # judged, not "not run"
        runs = json.loads((matrix_results / name / "results.json").read_text())["runs"]
        assert {(r["engine"], r["workload"], r["load"]["n"]) for r in runs} == {
            (e, w, n) for e in ("skippy", "llama-server") for w in ("chat", "gen", "chat-shared") for n in (1, 4)}
        assert all(q["error"] is None for r in runs for q in r["requests"]), name  # below the ceiling: no failure
        over = json.loads((matrix_results / name / "overload" / "results.json").read_text())["runs"]
        skippy = next(r for r in over if r["engine"] == "skippy")
        errors = [q["error"] for q in skippy["requests"] if not q["warmup"]]
        assert len(errors) == 8 and all(e is None or e.startswith("HTTP 429") for e in errors), errors
        assert (matrix_results / name / "chat-closed.png").read_bytes().startswith(b"\x89PNG")
        good = json.loads((matrix_results / name / "goodput" / "results.json").read_text())["runs"]
        assert {(r["engine"], r["workload"], r["load"]["kind"]) for r in good} == {
            (e, "chat", "poisson") for e in ("skippy", "llama-server")}  # quick: one rate, at capacity
    assert "TTFT ≤ 10 × and TPOT ≤ 5 ×" in summary and "## Overload" in summary and "## Goodput" in summary

    ok = await bench("check", str(matrix_results), *LENIENT, budget=60)
    out = ok.stdout.decode()
    assert ok.returncode == 0, out + ok.stderr.decode()  # lenient margins: only failures or a dirty overload fail
    assert all(f"=== {name}: PASS" in out for name in CLASS_NAMES), out
    strict = await bench("check", str(matrix_results), *LENIENT, "--vs-llama-throughput", "1000", budget=60)
    assert strict.returncode == 1 and "=== dense: FAIL" in strict.stdout.decode()

    redrawn = await bench("report", str(matrix_results), "--slo-tpot-ms", "0.001", budget=60)
    assert redrawn.returncode == 0, redrawn.stderr.decode()
    assert "## Verdicts" in (matrix_results / "summary.md").read_text()
