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
                           "out_tok_per_s", "python_overhead_pct"}
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["max_running"] == 4 and result["mixed_steps"] > 0
    assert 0 <= result["python_overhead_pct"] <= 100
