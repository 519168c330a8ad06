"""Running a child process that prints a digest of what it computed, with a patch's switch set or not:
how a patch's exactness claim is checked against the upstream path it keeps behind an environment flag
(most patches read their flag once per process, so each side needs a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def digest_with(child: Path, args: Sequence[str], flag: str, on: bool, timeout: float = 600) -> str:
    """The child's last line, run with `flag`=1 when `on` and without it otherwise."""
    env = dict(os.environ)
    env.pop(flag, None)
    if on:
        env[flag] = "1"
    out = subprocess.run([sys.executable, str(child), *args], check=True, capture_output=True, text=True,
                         timeout=timeout, env=env).stdout
    return out.strip().splitlines()[-1]
