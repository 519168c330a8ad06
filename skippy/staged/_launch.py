"""Starting later stages as `skippy stage` processes on one host (loopback): the local launcher
behind `skippy pipeline`, and what the tests and the bench use to run real separate processes.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from ..errors import SkippyError

READY = re.compile(r"skippy stage: listening on (\S+):(\d+)")


class StageLaunchError(SkippyError):
    """A stage process exited or did not say it was listening in time."""


def stage_argv(model: os.PathLike[str] | str, layers: tuple[int, int], listen: str,
               next_addr: str | None = None, options: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "skippy", "stage", "--model", str(model), "--layers", f"{layers[0]}:{layers[1]}",
            "--listen", listen]
    if next_addr:
        argv += ["--next", next_addr]
    return argv + list(options)


class StageProcess:
    """One `skippy stage` child; `port` is what it bound (ask for port 0 to let the OS choose)."""

    def __init__(self, argv: list[str], *, netns: str | None = None, timeout: float = 120.0,
                 env: dict[str, str] | None = None) -> None:
        self.argv = (["ip", "netns", "exec", netns] if netns else []) + argv
        # env: e.g. the stage secret, passed through the environment to stay out of the process list
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                     env=None if env is None else {**os.environ, **env})
        self.host, self.port = self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    break
                match = READY.search(line)
                if match:
                    return match.group(1), int(match.group(2))
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise StageLaunchError(f"stage {' '.join(self.argv)} did not start (exit code {self.proc.poll()})")

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def launch_stages(model: os.PathLike[str] | str, splits: Sequence[tuple[int, int]], *, host: str = "127.0.0.1",
                  options: Sequence[str] = (), timeout: float = 120.0,
                  secret: str | None = None) -> list[StageProcess]:
    """Start stages 1..K-1 of `splits` (the last first: each needs its next's port); returns them
    in pipeline order. Stage 0 is the caller's (it serves the requests). `secret` reaches the
    stages as $SKIPPY_STAGE_SECRET (never on their command line)."""
    from ._auth import ENV_VAR

    env = {ENV_VAR: secret} if secret is not None else None
    started: list[StageProcess] = []
    next_addr = None
    try:
        for layers in reversed(list(splits)[1:]):
            stage = StageProcess(stage_argv(Path(model), tuple(layers), f"{host}:0", next_addr, options), timeout=timeout,
                                 env=env)
            started.append(stage)
            next_addr = stage.addr
    except BaseException:
        for stage in started:
            stage.kill()
        raise
    return started[::-1]
