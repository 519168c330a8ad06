"""A matrix directory's layout and reading it back: matrix.json, and per class its sweep's,
overload/ and goodput/ runs' records (see matrix.py for what writes them).

Apart from matrix.py because the report (matrix_report.py) and the goodput run (matrix_goodput.py)
read a matrix directory too, and matrix.py runs both: each importing matrix.py back was a circle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import attrs

from .engines import FAST, NEW, OLD, PEER, STOCK
from .records import RunResult
from .report import has_results, load_results

MATRIX_JSON = "matrix.json"
OVERLOAD_DIR = "overload"
GOODPUT_DIR = "goodput"


def is_matrix(path: Path) -> bool:
    return (path / MATRIX_JSON).exists()


@attrs.frozen
class ClassData:
    """What one class of a matrix directory holds (runs empty when it never finished)."""

    entry: dict[str, Any] = attrs.field(hash=False)
    meta: dict[str, Any] | None = attrs.field(hash=False)
    runs: tuple[RunResult, ...]
    overload: tuple[RunResult, ...]
    goodput: tuple[RunResult, ...] = ()  # open-loop Poisson (matrix_goodput.py)
    batched: tuple[dict[str, Any], ...] = attrs.field(default=(), hash=False)  # its sweep's llama-batched-bench


def load_goodput(base: Path) -> tuple[RunResult, ...]:
    """The goodput run's records of a class directory (none when it never ran)."""
    return tuple(load_results(base / GOODPUT_DIR)[1]) if has_results(base / GOODPUT_DIR) else ()


def load_matrix(path: Path) -> tuple[dict[str, Any], list[ClassData]]:
    """matrix.json and, per class, its sweep's, overload and goodput runs' records (whatever exists)."""
    data = json.loads((path / MATRIX_JSON).read_text())
    out = []
    for entry in data["meta"]["classes"]:
        base = path / entry["dir"]
        meta, runs, batched = load_results(base) if has_results(base) else (None, [], [])
        over = load_results(base / OVERLOAD_DIR)[1] if has_results(base / OVERLOAD_DIR) else []
        good = load_goodput(base) if entry.get("goodput") else ()  # a stale goodput/ of a rerun class: not read
        out.append(ClassData(entry, meta, tuple(runs), tuple(over), good, tuple(batched)))
    return data, out


def engines_present(classes: Sequence[ClassData]) -> list[str]:
    order = (NEW, FAST, OLD, PEER, STOCK)
    present = {r.engine for c in classes for r in c.runs}
    return [e for e in order if e in present]
