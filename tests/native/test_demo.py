"""`skippy demo` as a user runs it: N sessions, one JSON line at the end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.native


def test_demo_on_a_synthetic_family_ends_with_one_json_line(native_build):
    run = subprocess.run(
        [sys.executable, "-m", "skippy", "demo", "--family", "llama", "--sessions", "6", "--max-tokens", "8",
         "--threads", "1", "--n-ctx", "1024", "--n-seq-max", "4"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == {"completed", "failed", "max_running", "steps", "mixed_steps", "preemptions",
                           "out_tok_per_s", "step_overhead_pct", "prefix_hit_tokens", "prefill_tokens",
                           "kv_cells_peak", "tpot_slo_ms", "slo_met", "slo_missed"}
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["max_running"] == 4 and result["mixed_steps"] > 0
    assert 0 <= result["step_overhead_pct"] <= 100
    assert result["tpot_slo_ms"] > 0  # derived at open from this machine's steps
    assert result["slo_met"] + result["slo_missed"] == 6  # every session scored against the targets


def test_demo_with_a_shared_system_prompt_computes_it_once(native_build):
    """The prefix issue's done-when, on a tiny model: 16 sessions over a 512-token system prompt."""
    run = subprocess.run(
        [sys.executable, "-m", "skippy", "demo", "--family", "llama", "--sessions", "16", "--max-tokens", "16",
         "--threads", "1", "--n-ctx", "4096", "--shared-prefix-tokens", "512", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["completed"] == 16 and result["prefix_hit_tokens"] >= 15 * 512
    suffix = 24  # the longest of the demo's own prompts, in tokens, is under this
    assert result["kv_cells_peak"] < 512 + 16 * (suffix + 16) * 1.5
