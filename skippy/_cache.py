"""Where Skippy keeps what it fetches and builds: one directory, overridable for CI and tests."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$SKIPPY_CACHE`, else `$XDG_CACHE_HOME/skippy`, else `~/.cache/skippy`."""
    explicit = os.environ.get("SKIPPY_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "skippy"
