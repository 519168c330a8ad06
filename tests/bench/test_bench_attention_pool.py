"""bench/attention_pool.py: its tool runs, retries of lost result lines, and the goal verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.attention_pool import argv, render, run_config

pytestmark = pytest.mark.bench

# like llama-batched-bench, except that it prints the result of the first batch size of -npl only;
# the decode speed tells the KV mode apart
FAKE_TOOL = f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
first = int(args[args.index("-npl") + 1].split(",")[0])
tg = 100.0 if "-kvu" in args else 110.0
print(json.dumps({{"pl": first, "speed_pp": 300.0, "speed_tg": tg * first, "t_pp": 1.0, "t_tg": 2.0}}))
"""


def test_argv_sizes_the_context_for_the_largest_batch_and_ends_with_a_sacrificial_run():
    cmd = argv(Path("/t/llama-batched-bench"), Path("/m.gguf"), "split", [1, 8, 32], 128, 64, 2)
    assert cmd[cmd.index("-c") + 1] == str(32 * (128 + 64 + 64))
    assert cmd[cmd.index("-npl") + 1] == "1,8,32,1"
    assert "-no-kvu" in cmd and "-kvu" not in cmd
    assert cmd[cmd.index("-fa") + 1] == "on"


def test_lost_rows_are_run_again(tmp_path: Path):
    tool = tmp_path / "llama-batched-bench"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    rows = run_config(tool, Path("/m.gguf"), "unified", [1, 8, 32], 16, 8, 2, tmp_path / "log", attempts=3)
    assert sorted(rows) == [1, 8, 32]
    assert rows[8]["speed_tg"] == 800.0
    with pytest.raises(RuntimeError, match="no result for B=\\[32\\]"):
        run_config(tool, Path("/m.gguf"), "unified", [1, 8, 32], 16, 8, 2, tmp_path / "log2", attempts=2)


def test_render_reports_the_ratios_and_whether_the_goal_is_met(tmp_path: Path):
    tg = {("stock", "split"): 160.0, ("stock", "unified"): 90.0, ("patched", "split"): 200.0}
    rows = []
    for b, patched_unified in ((32, 196.0), (64, 150.0)):
        for (build, mode), speed in {**tg, ("patched", "unified"): patched_unified}.items():
            rows.append({"model": "m", "build": build, "mode": mode, "B": b, "pp_tok_s": 300.0,
                         "tg_tok_s": speed, "t_tg_s": 1.0, "t_pp_s": 1.0})
    meta = {"command": "python bench/attention_pool.py", "npp": 128, "ntg": 64, "threads": 2, "cpu_flags": ["avx2"]}
    render(rows, meta, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "- m B=32: unified/split 0.98: met" in summary
    assert "- m B=64: unified/split 0.75: NOT met" in summary
    assert "| m | 32 | 160.0 | 90.0 | 200.0 | 196.0 | 0.98 (0.98) | 1.23 |" in summary
    assert (tmp_path / "decode.png").stat().st_size > 0


def test_a_ratio_over_rounds_is_the_median_of_each_rounds_own_pair(tmp_path: Path):
    """A slow round slows both sides of its pair: the per-round ratio is what is compared."""
    rows = []
    for k, (split, unified) in enumerate([(200.0, 196.0), (100.0, 99.0), (210.0, 150.0)]):
        for mode, speed in (("split", split), ("unified", unified)):
            rows.append({"model": "m", "build": "patched", "mode": mode, "B": 32, "round": k, "pp_tok_s": 300.0,
                         "tg_tok_s": speed, "t_tg_s": 1.0, "t_pp_s": 1.0})
    meta = {"command": "c", "npp": 128, "ntg": 64, "threads": 2, "cpu_flags": [], "rounds": 3}
    render(rows, meta, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    # per round 0.98, 0.99, 0.71: the median 0.98 (the medians of the sides, 150/200, would say 0.75)
    assert "| m | 32 | 200.0 | 150.0 | 0.98 (0.98 0.99 0.71) |" in summary
    assert "- m B=32: unified/split 0.98: met" in summary
