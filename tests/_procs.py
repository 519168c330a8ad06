"""Stopping a server a test started as a child process: what the CLI tests share."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 30, group: bool = False) -> None:
    """SIGTERM (what a user's Ctrl-C or a supervisor sends) and wait; past `timeout`, SIGKILL it (its
    whole process group with `group`) so a failed test leaves nothing behind."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()
