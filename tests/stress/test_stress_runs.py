"""CI-sized stress runs (the scripts in stress/, at N=64 x 3 rounds on the tiny synthetic llama),
with every invariant asserted; and proof that a run fails when the engine really misbehaves."""

from __future__ import annotations

import json
import sys

import attrs
import pytest
import trio

from stress import engine_run, server_run
from stress.cli import RunConfig

pytestmark = [pytest.mark.stress, pytest.mark.native]

# N=64 per round, 3 rounds (RSS is compared between round 2 and round 3), a KV pool at a quarter
# of each round's demand; a few seconds per run on the tiny model.
CI = RunConfig(sessions=64, rounds=3, seed=0, family="llama", threads=1, quiet=True)

ENGINE_INVARIANTS = {
    "every request has exactly one outcome", "no decode failure reached a client",
    "every request got a completion or a clear error",
    "event streams well formed (contiguous indices, one final event)",
    "engine finished every accepted request once", "KV memory back to idle after drain",
    "sampled greedy completions equal solo greedy output",
}
SERVER_INVARIANTS = {
    "every request has exactly one outcome", "no decode failure reached a client",
    "every request got a completion or a clear error", "responses well formed (one finish, one [DONE], unique ids)",
    "server finished every request at most once, none in error", "KV memory back to idle after drain",
    "server released the connections its clients closed", "sampled greedy completions equal solo greedy output",
}


def failed(result: dict) -> list[str]:
    return [f"{c['name']}: {c['detail']}" for c in result["invariants"] if not c["ok"]]


def names(result: dict) -> set[str]:
    return {c["name"] for c in result["invariants"]}


def assert_exercised(result: dict) -> None:
    """The run did what it claims: pressure on the pool, and every kind of ending."""
    totals = result["totals"]
    assert totals["demand_over_pool"] >= 3.5, totals
    assert totals["parity_compared"] >= 3 * 4, totals
    seen: set[str] = set()
    for row in result["rounds"]:
        seen |= set(row["outcomes"])
    assert {"completed", "client_cancelled", "rejected"} <= seen, seen


async def test_engine_stress_run_keeps_every_invariant(synth_model_path):
    synth_model_path("llama")
    with trio.fail_after(120):
        result = await engine_run.run(CI, progress=False)
    assert result["ok"], failed(result)
    assert {f"all rounds: {n}" for n in ENGINE_INVARIANTS} | {"RSS not growing across rounds"} <= names(result)
    assert_exercised(result)
    assert result["totals"]["finished"]["error"] == 0


_server: dict = {}


async def server_result() -> dict:
    """One CI-sized server run per module, shared by the tests below (run on first use)."""
    if "result" not in _server:
        with trio.fail_after(150):
            _server["result"] = await server_run.run(CI, progress=False)
    return _server["result"]


RELEASED = "server released the connections its clients closed"


async def test_server_stress_run_keeps_every_invariant(synth_model_path):
    synth_model_path("llama")
    result = await server_result()
    assert failed(result) == []  # including RELEASED: connections clients closed are closed (_hypercorn_trio)
    assert result["totals"]["server_log_findings"] == []
    assert {f"all rounds: {n}" for n in SERVER_INVARIANTS} | {
        "RSS not growing across rounds", "server logged no error", "server stopped cleanly on SIGINT"} <= names(result)
    assert_exercised(result)
    statuses: set[str] = set()
    for row in result["rounds"]:
        statuses |= set(row["http_statuses"])
    assert {"200", "400", "404"} <= statuses and not any(s.startswith("5") for s in statuses), statuses


async def test_the_engine_run_fails_when_a_step_fails(synth_model_path):
    """Inject one failing decode mid-run (the RuntimeOwner calls runtime.decode in its worker thread):
    the run must report the decode failure and exit non-zero, while nothing is lost or leaked."""
    synth_model_path("llama")
    calls = 0

    def inject(engine) -> None:
        decode = engine.runtime.decode

        def failing(*args):
            nonlocal calls
            calls += 1
            if calls == 40:
                raise RuntimeError("injected failure in step 40")
            return decode(*args)

        engine.runtime.decode = failing

    cfg = attrs.evolve(CI, sessions=32, rounds=1, parity_sample=4)
    with trio.fail_after(120):
        result = await engine_run.run(cfg, progress=False, on_engine=inject)
    assert not result["ok"] and calls > 40
    bad = {c["name"] for c in result["invariants"] if not c["ok"]}
    assert "round 1: no decode failure reached a client" in bad
    assert "round 1: engine finished every accepted request once" in bad  # finished["error"] > 0
    assert "round 1: every request has exactly one outcome" not in bad
    assert "round 1: KV memory back to idle after drain" not in bad
    assert result["totals"]["finished"]["error"] >= 1


async def test_the_scripts_run_from_the_command_line(synth_model_path, tmp_path):
    synth_model_path("llama")
    out = tmp_path / "engine-cli"
    with trio.fail_after(120):
        proc = await trio.run_process(
            [sys.executable, "-m", "stress.engine_run", "--sessions", "16", "--rounds", "3", "--seed", "5",
             "--family", "llama", "--quiet", "--out", str(out)],
            cwd=str(engine_run.__file__).rsplit("/stress/", 1)[0], capture_stdout=True, capture_stderr=True,
            check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    line = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert line["ok"] and line["failed"] == [] and line["totals"]["requests"] == 48
    assert "PASS all rounds: KV memory back to idle after drain" in proc.stderr.decode()
    result = json.loads((out / "results.json").read_text())
    assert result["command"].startswith("python -m stress.engine_run --sessions 16")
    assert "PASS" in (out / "summary.md").read_text()
