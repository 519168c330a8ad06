"""The lane plan of a real model: measure what each memory component costs, then size.

Shared by the engine (at load) and `skippy plan`, so what the command prints is what the
engine does. The sizing itself is pure (scheduling.lanes); this module only measures.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .families import kv_class
from .kv import ComponentKind
from .native import Context, ContextOptions, Model
from .scheduling.lanes import LanePlan, MemoryCosts, plan_lanes

DEFAULT_N_CTX = 4096


def pool_cells(n_ctx: int | None, memory_bytes: int | None) -> int | None:
    """The cell pool asked for: `n_ctx`, else derived from a memory budget (None), else 4096."""
    if n_ctx is not None:
        return n_ctx
    return None if memory_bytes is not None else DEFAULT_N_CTX


def context_base(n_batch: int, threads: int | None, batch_invariant: bool) -> dict[str, Any]:
    """The ContextOptions every engine and stage starts from: one ubatch per step."""
    return dict(n_batch=n_batch, n_ubatch=n_batch, threads=threads or min(8, os.cpu_count() or 1),
                batch_invariant=batch_invariant)


def measure_costs(model: Model, options: Mapping[str, Any]) -> MemoryCosts:
    """Bytes per attention cell, per sliding-window cell and per recurrent state, on a one-lane probe context."""
    probe = ContextOptions(**{**options, "n_ctx": 256, "n_seq_max": 1})
    with Context(model, probe) as ctx:
        ledger = ctx.ledger()

    def per_unit(kind: ComponentKind) -> float:
        c = ledger.get(kind)
        return c.bytes / c.size if c is not None and c.size else 0.0

    return MemoryCosts(
        attn_bytes_per_cell=per_unit(ComponentKind.ATTN),
        swa_bytes_per_cell=per_unit(ComponentKind.SWA),
        n_swa=model.n_swa if ledger.get(ComponentKind.SWA) is not None else 0,
        recurrent_bytes_per_seq=per_unit(ComponentKind.RECURRENT),
        swa_full=bool(options.get("swa_full", False)),
    )


def plan_for(
    model: Model,
    options: Mapping[str, Any],
    *,
    n_ctx: int | None,
    requested: int | None = None,
    reserved: int = 0,
    floor_ctx_per_session: int = 128,
    memory_bytes: int | None = None,
    prefix_fraction: float = 0.0,
    measure: bool = True,
) -> LanePlan:
    """The plan for `model` under these context options (n_ctx None: derived from memory_bytes)."""
    kv = kv_class(model.arch)
    costs = measure_costs(model, options) if measure or kv.recurrent or memory_bytes is not None else None
    return plan_lanes(kv, n_ctx, options["n_batch"], requested=requested, reserved=reserved,
                      floor_ctx_per_session=floor_ctx_per_session, costs=costs, memory_bytes=memory_bytes,
                      n_ubatch=options.get("n_ubatch"), prefix_fraction=prefix_fraction,
                      )
