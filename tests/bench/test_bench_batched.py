"""llama-batched-bench's output is parsed and a lost result line is measured again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from bench.gate.batched import batched_argv, parse_jsonl, run_batched_bench
from bench.gate.engines import ServerConfig
from bench.gate.model import ModelSpec

pytestmark = pytest.mark.bench

ROW = {"pp": 32, "tg": 8, "pl": 4, "n_kv": 160, "t_pp": 0.1, "speed_pp": 1280.0, "t_tg": 0.2, "speed_tg": 160.0,
       "t": 0.3, "speed": 533.3}

# like the real tool, except that it prints the result of the first batch size of -npl only
FAKE_TOOL = f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
first = int(args[args.index("-npl") + 1].split(",")[0])
print("main: n_kv_max = 1024 (a log line)")
print(json.dumps({{**{ROW!r}, "pl": first}}))
"""


def test_parse_keeps_only_result_lines():
    text = "\n".join(["llama_model_load: done", json.dumps(ROW), '{"type": "log"}', "{broken", ""])
    assert parse_jsonl(text) == [ROW]


def config() -> ServerConfig:
    return ServerConfig(ModelSpec(None, "llama", Path("/nonexistent.gguf")), threads=2, n_ctx=1024, n_batch=64)


async def test_missing_rows_are_run_again(tmp_path: Path):
    tool = tmp_path / "llama-batched-bench"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    with trio.fail_after(30):
        entry = await run_batched_bench(tool, config(), 32, 8, [1, 2, 4], tmp_path / "log.txt", timeout=10)
    assert [r["pl"] for r in entry["rows"]] == [1, 2, 4] and "error" not in entry
    assert (tmp_path / "log.txt").read_text().count("=== next attempt ===") == 2
    with trio.fail_after(30):
        short = await run_batched_bench(tool, config(), 32, 8, [1, 2, 4, 8], tmp_path / "log.txt", timeout=10)
    assert [r["pl"] for r in short["rows"]] == [1, 2, 4] and "no result for B=8" in short["error"]


async def test_a_tool_that_cannot_start_is_an_error_not_a_crash(tmp_path: Path):
    with trio.fail_after(30):
        entry = await run_batched_bench(tmp_path / "missing", config(), 32, 8, [1], tmp_path / "log.txt", timeout=10)
    assert entry["rows"] == [] and "FileNotFoundError" in entry["error"]


# prints every batch size of -npl in order, the sacrificial last one with another speed
ALL_TOOL = f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
sizes = [int(b) for b in args[args.index("-npl") + 1].split(",")]
for i, b in enumerate(sizes):
    print(json.dumps({{**{ROW!r}, "pl": b, "speed_tg": -1.0 if i == len(sizes) - 1 else 160.0}}))
"""


async def test_a_last_sacrificial_run_keeps_the_lines_before_it_and_is_ignored(tmp_path: Path):
    """llama.cpp's logger loses lines queued just before exit: the smallest batch runs once more at the end."""
    argv = batched_argv(Path("tool"), config(), 32, 8, [4, 1, 8])
    assert argv[argv.index("-npl") + 1] == "4,1,8,1"
    tool = tmp_path / "llama-batched-bench"
    tool.write_text(ALL_TOOL)
    tool.chmod(0o755)
    with trio.fail_after(30):
        entry = await run_batched_bench(tool, config(), 32, 8, [1, 2], tmp_path / "log.txt", timeout=10)
    assert [(r["pl"], r["speed_tg"]) for r in entry["rows"]] == [(1, 160.0), (2, 160.0)] and "error" not in entry
