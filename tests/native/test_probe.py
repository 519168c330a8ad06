"""A GGUF that makes llama.cpp abort is refused through a probe process; ours survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from skippy.errors import ModelLoadError
from skippy.models import synth
from skippy.native import probe_model

pytestmark = pytest.mark.native


@pytest.fixture
def aborting_model(tmp_path, monkeypatch):
    """qwen3next with expert_used_count but no expert_count: llama.cpp's loader asserts (abort)."""
    write_hparams = synth._Model.hparams

    def without_expert_count(self, values):
        return write_hparams(self, {k: v for k, v in values.items() if k != "expert_count"})

    monkeypatch.setattr(synth._Model, "hparams", without_expert_count)
    return synth.write_synthetic("qwen3next", tmp_path / "aborts.gguf")


def test_loading_it_in_process_would_kill_the_process(native_build, aborting_model):
    """The premise: this file really takes the loading process down."""
    code = f"from skippy.native import Model; Model({str(aborting_model)!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    assert proc.returncode == -signal.SIGABRT, proc.stderr[-500:]


def test_the_probe_turns_the_crash_into_a_named_error(native_build, aborting_model, small_ctx):
    with pytest.raises(ModelLoadError, match="cannot load this file safely") as info:
        probe_model(aborting_model)
    assert "SIGABRT" in str(info.value)
    small_ctx.seq_rm(-1)  # and this process still works
    assert small_ctx.seq_pos_max(0) == -1


def test_a_good_model_passes_the_probe(native_build, synth_model_path):
    probe_model(synth_model_path("falcon-h1"))


def test_the_cli_refuses_it_cleanly(native_build, aborting_model):
    run = subprocess.run([sys.executable, "-m", "skippy", "generate", "hi", "--model", str(aborting_model)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "cannot load this file safely" in run.stderr
    assert "Traceback" not in run.stderr
