"""The per-class cutover switch (skippy.cutover): `--scheduler auto` follows this machine's gate
verdict for the model, else the shipped table (which must be the committed matrix's), and a
stale, foreign or corrupt verdict file is ignored with a log line or refused with a clear error."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from loguru import logger

from skippy import cutover
from skippy.cutover import (GATE_CLASSES, SHIPPED, Decision, GateVerdict, GateVerdictError, Hardware, decide,
                            load_verdict, store_verdict, verdict_path)
from skippy.errors import SkippyError

ROOT = Path(__file__).resolve().parent.parent
HERE = Hardware("Test CPU 9000", ("avx2", "fma"), 2)
SHA = "ab" * 32


def verdict(passed: bool = True, **changes) -> GateVerdict:
    fields = dict(model_sha256=SHA, model="m.gguf", arch="llama", gate_class="dense", hardware=HERE, threads=2,
                  build="build-1", passed=passed, checks=("PASS  exactness", "PASS  N=1"),
                  command="skippy gate --model m.gguf", date="2026-12-04T11:00:00+00:00")
    return GateVerdict(**{**fields, **changes})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SKIPPY_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture
def warnings():
    lines: list[str] = []
    logger.enable("skippy")
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    yield lines
    logger.remove(sink)


# -- decide(): the policy ----------------------------------------------------------------------


@pytest.mark.parametrize("choice", ["batched", "single-lane"])
def test_an_explicit_choice_stands_whatever_the_verdicts(choice):
    for v in (None, verdict(True), verdict(False)):
        assert decide(choice, "llama", v) == Decision(choice, "asked for with --scheduler")


def test_auto_follows_this_machines_verdict_before_the_shipped_table():
    assert not SHIPPED["dense"].passed  # so a passing verdict is what turns batching on
    on = decide("auto", "llama", verdict(True))
    off = decide("auto", "llama", verdict(False))
    assert on.scheduler == "batched" and "`skippy gate` passed" in on.reason and "2026-12-04" in on.reason
    assert off.scheduler == "single-lane" and "`skippy gate` failed" in off.reason


@pytest.mark.parametrize("arch", sorted(GATE_CLASSES))
def test_auto_without_a_verdict_takes_the_classes_shipped_verdict(arch):
    shipped = SHIPPED[GATE_CLASSES[arch]]
    d = decide("auto", arch, None)
    assert d.scheduler == ("batched" if shipped.passed else "single-lane")
    assert GATE_CLASSES[arch] in d.reason and shipped.checks in d.reason and cutover.SHIPPED_SOURCE in d.reason


def test_auto_on_an_architecture_no_gate_ran_stays_single_lane():
    d = decide("auto", "mamba2", None)
    assert d.scheduler == "single-lane" and "'mamba2'" in d.reason and "--scheduler batched" in d.reason


def test_an_unknown_scheduler_is_a_named_error():
    with pytest.raises(SkippyError, match="--scheduler must be one of"):
        decide("fast", "llama", None)


def test_the_startup_line_names_the_choice_and_why():
    assert Decision("single-lane", "because").line() == "scheduler: single-lane (because)"


def test_the_shipped_table_is_the_committed_matrixs_verdicts():
    """What `python -m bench.gate check bench/results/gate-matrix` prints, per class: PASS/FAIL and
    how many checks passed. The table cannot drift from the matrix it cites."""
    from bench.gate.matrix_dir import load_matrix
    from bench.gate.matrix_report import verdicts

    rows = verdicts(*load_matrix(ROOT / "bench" / "results" / "gate-matrix"))
    got = {c.entry["name"]: cutover.Shipped(v.passed, f"{sum(k.passed for k in v.checks)}/{len(v.checks)}")
           for c, v in rows}
    assert got == SHIPPED
    assert set(GATE_CLASSES.values()) == set(SHIPPED)


# -- the verdict file ----------------------------------------------------------------------------


def test_a_verdict_round_trips_through_its_file(cache):
    v = verdict(True)
    path = store_verdict(v)
    assert path == verdict_path(SHA, HERE) and path.parent == cache / "gate"
    assert path.name.startswith(SHA[:16]) and HERE.key() in path.name
    assert load_verdict(SHA, HERE, 2, "build-1") == v
    assert GateVerdict.from_json(path.read_text()) == v
    assert '"command": "skippy gate --model m.gguf"' in path.read_text() and '"date"' in path.read_text()


def test_no_verdict_is_none(cache):
    assert load_verdict(SHA, HERE, 2, "build-1") is None


@pytest.mark.parametrize("threads, build, why", [
    (4, "build-1", "measured with --threads 2, this server runs 4"),
    (2, "build-2", "another native build (build-1; this one is build-2)"),
])
def test_a_stale_verdict_is_ignored_with_a_log_line(cache, warnings, threads, build, why):
    path = store_verdict(verdict(True))
    assert load_verdict(SHA, HERE, threads, build) is None
    assert any(str(path) in line and why in line for line in warnings), warnings


def test_an_older_gates_verdict_is_stale(cache, warnings):
    store_verdict(verdict(True, version=cutover.GATE_VERSION - 1))
    assert load_verdict(SHA, HERE, 2, "build-1") is None
    assert any(f"gate version {cutover.GATE_VERSION - 1}" in line for line in warnings)


def test_another_machines_verdict_is_ignored_with_a_log_line(cache, warnings):
    """A cache shared or copied between hosts: the other host's verdict for this model is found,
    named and not used."""
    there = attrs.evolve(HERE, cpu="Other CPU", isa=("avx512f",))
    path = store_verdict(verdict(True, hardware=there))
    assert load_verdict(SHA, HERE, 2, "build-1") is None
    assert any(str(path) in line and "other hardware (Other CPU (avx512f)" in line for line in warnings), warnings
    assert load_verdict(SHA, there, 2, "build-1") is not None  # on its own machine it still counts


def test_another_models_verdict_is_never_taken(cache, warnings):
    store_verdict(verdict(True))
    assert load_verdict("cd" * 32, HERE, 2, "build-1") is None


def test_a_verdict_under_another_models_name_is_foreign(cache, warnings):
    path = verdict_path(SHA, HERE)
    path.parent.mkdir(parents=True)
    path.write_text(verdict(True, model_sha256="cd" * 32, model="other.gguf").to_json())
    assert load_verdict(SHA, HERE, 2, "build-1") is None
    assert any("another model (other.gguf" in line for line in warnings)


@pytest.mark.parametrize("text", ["", "{\"model\": ", "[]", "{\"passed\": true}", "not json at all",
                                  verdict(True).to_json().replace("true", "\"yes\"")])
def test_a_corrupt_verdict_file_is_a_named_error(cache, text):
    path = verdict_path(SHA, HERE)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(GateVerdictError, match=f"{path} is not a gate verdict.*delete it or run `skippy gate`"):
        load_verdict(SHA, HERE, 2, "build-1")


def test_hardware_here_names_the_cpu_and_its_isa():
    hw = cutover.hardware_here()
    assert hw.cpu and hw.cores >= 1 and hw.gpu == "none"
    assert set(hw.isa) <= set(cutover.ISA_FLAGS)
    assert hw.key() == cutover.hardware_here().key() and len(hw.key()) == 16
