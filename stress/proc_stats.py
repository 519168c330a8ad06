"""Resident memory, open file descriptors and threads of a process, from /proc (Linux): the
RSS-across-rounds and connections-released checks, and the soak's samples, read them."""

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


def threads(pid: int | str = "self") -> int:
    """Threads of the process (the soak watches them for growth); -1 where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time the process has used (the soak's CPU share per sample); nan where
    /proc does not say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def load_average() -> float:
    """The machine's 1-minute load average: what else competed for the CPUs (nan if unknown)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
