"""The lane plan of a FakeRuntime: its own sizes, read as a dense pool with a floor of one cell."""

from __future__ import annotations

from ..engine import EngineConfig, _prefix_fraction, _reserved
from ..families import KvClass
from ..scheduling.lanes import LanePlan, plan_lanes
from ._fake_runtime import FakeRuntime


def fake_lanes(runtime: FakeRuntime, cfg: EngineConfig) -> LanePlan:
    reserved = _reserved(cfg) if runtime.prefix_identity is not None else 0
    requested = min(runtime.n_seq_max - reserved, cfg.n_seq_max or 256)
    return plan_lanes(KvClass.DENSE, runtime.n_ctx, runtime.n_batch, requested=requested, reserved=reserved,
                      floor_ctx_per_session=1, prefix_fraction=_prefix_fraction(cfg, runtime.n_ctx))
