"""Resident memory of a process, from /proc (Linux): the RSS-across-rounds check reads it."""

from __future__ import annotations

from pathlib import Path


def rss_mib(pid: int | str = "self") -> float:
    """Current resident set (VmRSS) in MiB; nan where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("nan")
