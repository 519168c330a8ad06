"""Resident memory and open file descriptors of a process, from /proc (Linux): the RSS-across-rounds
and connections-released checks read them."""

from __future__ import annotations

import os
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


def open_fds(pid: int | str = "self") -> int:
    """File descriptors the process holds (sockets included); -1 where /proc does not say."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1
