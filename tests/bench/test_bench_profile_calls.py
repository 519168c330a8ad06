"""bench/profile_calls.py's summary: exact call counts per token, grouped by where the function lives."""

from __future__ import annotations

import cProfile
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.profile_calls import summarize, where  # noqa: E402


def _leaf() -> int:
    return 1


def _per_token() -> int:
    return _leaf() + _leaf()


def test_calls_are_counted_per_token_and_grouped(tmp_path):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        _per_token()
    prof.disable()
    prof.dump_stats(tmp_path / "p.prof")
    s = summarize(str(tmp_path / "p.prof"), tokens=50)
    mine = {f["function"].rsplit(":", 1)[1]: f["calls_per_token"] for f in s["top_functions"]}
    assert mine["_per_token"] == 1.0 and mine["_leaf"] == 2.0
    assert s["calls_per_token"] >= 3.0


def test_where_names_the_package_or_the_skippy_module():
    assert where("/x/.venv/lib/python3.11/site-packages/trio/_core/_run.py", "f") == "trio"
    assert where("/work/main/skippy/scheduling/step.py", "step") == "skippy/scheduling/step.py"
    assert where("~", "<built-in method builtins.len>") == "builtins (C)"
