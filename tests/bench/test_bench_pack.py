"""`bench.gate pack`: committed results are gzipped, and every reader takes either form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gate.report import has_results, pack, read_results


def _write(path: Path, complete: bool, size: int = 10) -> dict:
    path.mkdir(parents=True)
    data = {"meta": {"x": 1}, "runs": ["r" * size], "complete": complete}
    (path / "results.json").write_text(json.dumps(data))
    return data


def test_pack_compresses_finished_runs_and_reads_them_back(tmp_path: Path):
    done = _write(tmp_path / "a", True, 5000)
    running = _write(tmp_path / "b", False, 5000)
    small = _write(tmp_path / "c" / "d", True, 10)
    assert pack(tmp_path, min_bytes=1000) == [tmp_path / "a" / "results.json.gz"]
    assert not (tmp_path / "a" / "results.json").exists()
    assert (tmp_path / "a" / "results.json.gz").stat().st_size < 500
    assert (tmp_path / "b" / "results.json").exists()  # a sweep still resuming stays plain
    assert (tmp_path / "c" / "d" / "results.json").exists()
    assert [read_results(tmp_path / n) for n in ("a", "b", "c/d")] == [done, running, small]
    first = (tmp_path / "a" / "results.json.gz").read_bytes()
    (tmp_path / "a" / "results.json").write_text(json.dumps(done))
    pack(tmp_path / "a")
    assert (tmp_path / "a" / "results.json.gz").read_bytes() == first  # reproducible bytes: no churn in git


def test_a_directory_without_results_says_so(tmp_path: Path):
    assert not has_results(tmp_path)
    with pytest.raises(FileNotFoundError, match="results.json"):
        read_results(tmp_path)
