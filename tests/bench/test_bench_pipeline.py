"""bench/pipeline.py: the table's ratios are against the one-process run of the same N, the
busy shares against the run's wall time, and the stage processes' session lines parse."""

from __future__ import annotations

import pytest

from bench.pipeline import STATS, render
from skippy.staged._stage import SessionStats

pytestmark = pytest.mark.bench


def _row(config: str, n: int, tok_s: float, stages: int = 1, **extra) -> dict:
    row = {"config": config, "stages": stages, "threads_per_stage": 1, "N": n, "wall_s": 2.0,
           "out_tok_per_s": tok_s, "ttft_p50_s": 0.5, "ttft_p99_s": 0.6, "tpot_p50_s": 0.05, "tpot_p99_s": 0.06}
    return {**row, **extra}


def test_render_compares_with_one_process_at_the_same_n(tmp_path):
    below = [{"layers": "15:30", "decodes": 10, "micro_batches": 20, "busy_s": 1.5, "idle_s": 0.5}]
    rows = [
        _row("one process", 8, 100.0), _row("one process", 32, 200.0),
        _row("2 stages", 8, 60.0, 2, split="0:15 15:30", micro_batches=2, stage0_compute_s=1.0, stages_below=below),
        _row("2 stages", 32, 150.0, 2, split="0:15 15:30", micro_batches=2, stage0_compute_s=0.5, stages_below=below),
    ]
    meta = {"model": "m.gguf", "gen": 32, "machine": "x86_64, 2 cores", "command": "python bench/pipeline.py"}
    render(rows, meta, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "| 8 | 2 stages | 0:15 15:30 | 2 | 60.0 | 0.60x |" in summary
    assert "| 32 | 2 stages | 0:15 15:30 | 2 | 150.0 | 0.75x |" in summary
    assert "| 0: 50%, 1: 75% |" in summary and "| 0: 25%, 1: 75% |" in summary
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_the_stage_session_line_parses():
    stats = SessionStats((13, 25), decodes=7, micro_batches=9, tokens=120, busy_s=1.25, idle_s=0.5)
    match = STATS.search(stats.line())
    assert match is not None
    assert match.groups() == ("13", "25", "7", "9", "120", "1.250", "0.500")
