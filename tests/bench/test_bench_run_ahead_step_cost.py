"""bench/run_ahead_step_cost.py, CI-sized: on a synthetic model its streams do run ahead (the figure
it reports is the worker's run-ahead path, not the event loop's), and each round's time outside
llama_decode is its wall per decode less the decode."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_on_a_synthetic_model_runs_ahead_and_splits_each_decode(synth_model_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_ahead_step_cost.py"), "--model", str(synth_model_path("llama")),
         "--rounds", "2", "--max-tokens", "40", "--n-ctx", "512", "--prompt-len", "16"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rounds = re.findall(r"round \d+: (\d+) decodes; ms per decode ([\d.]+), in llama_decode ([\d.]+), outside ([\d.]+)",
                        out.stdout)
    assert len(rounds) == 2
    for decodes, wall, decode, outside in rounds:
        # counted from the reader's first token, by when a fast model's chained decodes may be ahead
        assert 30 <= int(decodes) <= 39
        assert abs(float(wall) - float(decode) - float(outside)) < 0.002
        assert float(outside) > 0
    steps = int(re.search(r"run-ahead steps (\d+)", out.stdout).group(1))
    assert steps >= 2 * 30  # most of each request's steps ran ahead on the worker thread
