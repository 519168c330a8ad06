"""Every `skippy` command turns an expected failure into one line on stderr and exit code 2,
never a traceback: a missing file, not a GGUF, a file llama.cpp cannot build (an architecture
it does not know), a memory skippy cannot count (LLaDA: no KV memory), a refused layer range."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skippy.models import synth

pytestmark = pytest.mark.native

COMMANDS = {
    "plan": ["plan"],
    "generate": ["generate", "hi", "--max-tokens", "2"],
    "demo": ["demo", "--sessions", "2", "--max-tokens", "2", "--quiet"],
    "serve": ["serve", "--port", "0"],  # refuses before it binds
}


def _skippy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skippy", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _one_line_error(run: subprocess.CompletedProcess, *needles: str) -> str:
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skippy: error: "), run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    (root / "text.gguf").write_text("not a model\n")
    unknown = synth._Model("mamba9", 0, 2)  # llama's tensors under an architecture llama.cpp does not know
    synth._build_llama(unknown)
    unknown.write(str(root / "mamba9.gguf"))
    return {"missing": (root / "missing.gguf", "model file not found"),
            "not-gguf": (root / "text.gguf", "not a GGUF file"),
            "unknown-arch": (root / "mamba9.gguf", "unknown model architecture: 'mamba9'")}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", ["missing", "not-gguf", "unknown-arch"])
def test_a_file_skippy_cannot_use_is_one_line(native_build, bad_files, command, case):
    path, needle = bad_files[case]
    _one_line_error(_skippy(*COMMANDS[command], "--model", str(path)), needle)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_memory_skippy_cannot_count_is_refused_by_type(native_build, command):
    _one_line_error(_skippy(*COMMANDS[command], "--family", "llada"), "unsupported memory type 'none'", "llada")


def test_an_unknown_family_is_one_line(native_build, tmp_path):
    _one_line_error(_skippy("plan", "--family", "gpt2"), "unknown family 'gpt2'")
    _one_line_error(_skippy("models", "synth", "gpt2", "--out", str(tmp_path / "x.gguf")), "unknown family 'gpt2'")


def test_a_refused_layer_range_is_a_clean_error(native_build):
    run = _skippy("pipeline", "--family", "llama", "--layers", "0:1,1:9", "--port", "0")
    _one_line_error(run, "past the model's 2 layers")
    # a stage loads its range first: llama.cpp logs its own reason, then skippy's one line
    run = _skippy("stage", "--family", "llama", "--layers", "1:9", "--listen", "127.0.0.1:0")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("skippy: error: ") and "layers [1, 9)" in last


def test_plan_prints_the_derived_class_of_a_recurrent_only_model(native_build):
    import json

    run = _skippy("plan", "--family", "mamba2", "--json")
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    assert (plan["kv_class"], plan["memory_type"]) == ("recurrent", "llama_memory_recurrent")
    assert set(plan["bytes"]) == {"recurrent"} and plan["bytes"]["recurrent"] > 0
