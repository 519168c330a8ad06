"""`skippy gate` and `skippy serve --scheduler` as a user runs them: the gate writes a verdict for
this model on this machine, `--scheduler auto` honours it before the shipped table, and a corrupt
verdict file stops serve with one line (exit 2), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import attrs
import pytest

from skippy import cli, cutover
from skippy.check import build_id, file_sha256

pytestmark = pytest.mark.native


@pytest.fixture
def gate_cache(private_cache):
    return private_cache / "gate"


def _skippy(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skippy", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ, check=False)


def _served_config(monkeypatch, *argv: str) -> tuple[dict, list[str]]:
    """What `skippy serve ARGV` would open the engine with, and the startup lines it would say,
    through cli._serve's own code (the HTTP server stubbed out)."""
    import skippy.engine

    seen: dict = {}
    monkeypatch.setattr(skippy.engine, "open_engine", lambda model, **config: config)
    monkeypatch.setattr(cli, "_serve_engine", lambda args, opener, host, port, startup=(): seen.update(
        config=opener(), startup=list(startup)) or 0)
    assert cli._serve(cli._parser().parse_args(["serve", *argv])) == 0
    return seen["config"], seen["startup"]


def test_gate_writes_a_verdict_that_auto_then_honours(synth_model_path, gate_cache, monkeypatch):
    path = synth_model_path("llama")
    run = _skippy("gate", "--family", "llama", "--threads", "1", "--sessions", "2", "--max-tokens", "8",
                  "--rounds", "1", "--quiet")
    assert run.returncode in (0, 1), run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[1] for line in lines[:4]] == ["exactness", "N=1", "throughput@N=2", "no"], run.stdout
    assert "need >= min(2, 0.9 x H=" in lines[2]  # the H rule, its threshold shown
    passed = all(line.startswith("PASS") for line in lines[:4])
    assert run.returncode == (0 if passed else 1)
    (stored,) = gate_cache.glob("*.json")
    assert lines[-1].endswith(f"verdict {stored}") and ("PASS" if passed else "FAIL") in lines[-1]

    verdict = cutover.GateVerdict.from_json(stored.read_text())
    assert verdict.model_sha256 == file_sha256(path) and verdict.arch == "llama" and verdict.gate_class == "dense"
    assert verdict.threads == 1 and verdict.build == build_id() and verdict.passed is passed
    assert verdict.hardware == cutover.hardware_here() and verdict.command.startswith("skippy gate --family llama")
    assert stored == cutover.verdict_path(verdict.model_sha256, verdict.hardware)

    # serve with the gate's thread count reads it; with another thread count it is stale, and the
    # shipped table (dense: FAIL) decides
    for outcome in (True, False):
        cutover.store_verdict(attrs.evolve(verdict, passed=outcome))
        config, startup = _served_config(monkeypatch, "--family", "llama", "--threads", "1")
        assert startup == [f"scheduler: {'batched' if outcome else 'single-lane'} (auto: `skippy gate` "
                           f"{'passed' if outcome else 'failed'} for this model on this machine on {verdict.date[:10]})"]
        assert config.get("n_seq_max") == (None if outcome else 1)
    config, startup = _served_config(monkeypatch, "--family", "llama", "--threads", "2")
    assert config["n_seq_max"] == 1 and "the dense class failed the gate" in startup[0]


def test_an_explicit_scheduler_overrides_the_switch(synth_model_path, gate_cache, monkeypatch):
    synth_model_path("llama")
    batched, said = _served_config(monkeypatch, "--family", "llama", "--scheduler", "batched", "--n-seq-max", "6")
    assert batched["n_seq_max"] == 6 and said == ["scheduler: batched (asked for with --scheduler)"]
    single, said = _served_config(monkeypatch, "--family", "llama", "--scheduler", "single-lane")
    assert single["n_seq_max"] == 1 and said == ["scheduler: single-lane (asked for with --scheduler)"]


def test_serve_refuses_a_corrupt_verdict_file_in_one_line(synth_model_path, gate_cache, monkeypatch):
    path = synth_model_path("llama")
    where = cutover.verdict_path(file_sha256(path), cutover.hardware_here())
    where.parent.mkdir(parents=True)
    where.write_text('{"model_sha256": "trunc')
    run = _skippy("serve", "--family", "llama", "--threads", "1", "--port", "0", timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "serving" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"skippy: error: {where} is not a gate verdict (JSONDecodeError: Unterminated string starting at: line 1 "
        "column 18 (char 17)); delete it or run `skippy gate` again"], run.stderr
    # an explicit --scheduler does not read it
    _, said = _served_config(monkeypatch, "--family", "llama", "--threads", "1", "--scheduler", "batched")
    assert said == ["scheduler: batched (asked for with --scheduler)"]
