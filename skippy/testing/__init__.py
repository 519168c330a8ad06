"""Test doubles for scheduler logic, kept apart from the main surface (like trio.testing).

- FakeRuntime: a deterministic stand-in Runtime with the real ledger's accounting (never
  for claims about llama.cpp behaviour).
- open_fake_engine: the real engine (actors and all) over a FakeRuntime.
- SyncScheduler: the engine's own step driven synchronously, for hypothesis machines.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from ..engine import Engine, EngineConfig, open_engine_on
from ._fake_runtime import FakeRuntime, chain, next_hash
from ._lanes import fake_lanes
from ._sync import SyncScheduler


@asynccontextmanager
async def open_fake_engine(runtime: FakeRuntime, **config: Any) -> AsyncIterator[Engine]:
    """An engine over `runtime`, its lanes planned from the fake's own sizes."""
    lanes = fake_lanes(runtime, EngineConfig(**config))
    async with open_engine_on(runtime, lanes, **config) as engine:
        yield engine


__all__ = ["FakeRuntime", "SyncScheduler", "chain", "fake_lanes", "next_hash", "open_fake_engine"]
