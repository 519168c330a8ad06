"""Collects what each invariance scenario measured and prints it at the end of the run."""

from __future__ import annotations

import pytest

_ROWS = pytest.StashKey[list]()


@pytest.fixture
def invariance_record(request):
    rows = request.config.stash.setdefault(_ROWS, [])

    def record(name: str, invariant: bool, scenario: str, differ: int, total: int) -> None:
        rows.append((name, invariant, scenario, differ, total))

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """What batch-invariant mode buys: sequences that differ from their solo run, per mode."""
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    terminalreporter.section("batch invariance: sequences differing from their solo run")
    for name, invariant, scenario, differ, total in sorted(rows, key=lambda r: (r[0], not r[1])):
        mode = "on " if invariant else "off"
        terminalreporter.write_line(f"{name:10s} {mode} {scenario:14s} {differ}/{total} differ")
