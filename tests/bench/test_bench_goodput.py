"""bench/goodput.py end to end on the tiny synthetic model: the N=1 run that scales the SLO, the closed
loop that measures capacity (and skippy's own closed loop told the fixed SLO), Poisson runs at two fractions of it with skippy told each SLO (and with
--shed-late), then goodput.json, summary.md and the plot. The figures of a tiny model on a loaded CI box
prove nothing about goodput (the committed runs under bench/results/goodput do); this proves the script
runs, resumes and reports what it ran."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from _stop import stop_gently  # noqa: E402 (tests/bench is on sys.path: no package here)

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
BUDGET_S = 600  # ~2 min on an idle 2-core machine; the native tools are built by the quick sweep's test first
SMALL = ["--threads", "2", "--n-ctx", "1024", "--n-batch", "64", "--short-in", "32", "--short-out", "8",
         "--warmup", "1", "--request-timeout", "60", "--startup-timeout", "60", "--min-requests", "4"]


async def goodput(out: Path) -> trio.CompletedProcess:
    from skippy.native import ensure_built

    with trio.fail_after(1200):
        await trio.to_thread.run_sync(lambda: ensure_built(tools=True, progress=False), abandon_on_cancel=True)
    with trio.fail_after(BUDGET_S):
        return await trio.run_process(
            [sys.executable, "bench/goodput.py", "--out-dir", str(out), "--name", "g", "--family", "llama",
             "--engines", "skippy", "llama-server", "--fractions", "0.8", "1.5", "--requests", "8", "--shed-late",
             "--sweep-args", *SMALL],
            cwd=REPO, check=False, capture_stdout=True, capture_stderr=True, deliver_cancel=stop_gently)


async def test_goodput_script_end_to_end_and_resumes(tmp_path: Path):
    done = await goodput(tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = tmp_path / "g"
    table = json.loads((out / "goodput.json").read_text())
    assert set(table["slos"]) == {"scaled", "fixed"} and table["slos"]["fixed"] == [2000.0, 200.0]
    assert table["capacity_req_s"] > 0 and len(table["rates"]) == 2
    for rate, row in table["rates"].items():
        assert set(row) == {"skippy", "llama-server", "skippy-shed"}, rate
        for engine, by_slo in row.items():
            assert set(by_slo) == {"scaled", "fixed"}, (rate, engine)
            for cell in by_slo.values():
                assert cell["goodput"] is not None and 0 <= cell["met"] <= 1
        assert all(c["failed"] == 0 for c in row["skippy"].values())  # by default nothing is dropped
    assert set(table["slo_capacity"]) == {"skippy", "llama-server", "skippy-shed"}
    summary = (out / "summary.md").read_text()
    assert "SLO capacity" in summary and "skippy-shed (fixed)" in summary
    assert (out / "goodput.png").stat().st_size > 1000
    # skippy was told the SLO it is scored on
    meta = json.loads((out / f"rate-{next(iter(table['rates']))}" / "fixed" / "results.json").read_text())["meta"]
    assert "--tpot-slo-ms" in meta["argv"]["skippy"] and "200" in meta["argv"]["skippy"]
    # the closed loop at N=32: skippy's fixed-SLO figure from its own run, told the fixed targets
    assert set(table["closed"]["N=32"]) == {"skippy", "llama-server"}
    assert all(set(by_slo) == {"scaled", "fixed"} for by_slo in table["closed"]["N=32"].values())
    closed_fixed = json.loads((out / "closed-fixed" / "results.json").read_text())["meta"]["argv"]
    assert set(closed_fixed) == {"skippy"} and "200" in closed_fixed["skippy"]
    assert "Closed loop" in summary and "goodput@N=32" in summary
    # a second run finds every stage complete and only rewrites the report
    again = await goodput(tmp_path)
    assert again.returncode == 0, again.stderr.decode()[-3000:]
    assert again.stderr.decode().count("done, kept") == 3 + 2 * 4
