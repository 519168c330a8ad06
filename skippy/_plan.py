"""The lane plan of a real model: measure what each memory component costs, then size.

One sizing for every context skippy opens: the engine (`open_engine`, through
`engine.plan_engine`), a pipeline's stage 0 (the same `plan_engine`, capped by what the
stages below hold and divided among its groups) and a later stage (`StageRuntime`) all call
`size_context`, and `skippy plan` prints what it returns. The sizing itself is pure
(scheduling.lanes); this module only probes (the KV class of the memory llama.cpp builds and
what each component costs, on a one-lane context), caps and divides.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import attrs

from .errors import InvalidInputError
from .families import KvClass, check_memory_type, derive_class
from .kv import ComponentKind, Ledger
from .native import Context, ContextOptions, Model
from .scheduling.lanes import LanePlan, MemoryCosts, PlanError, plan_lanes

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


@attrs.frozen
class MemoryProbe:
    """What a one-lane probe context says about the memory llama.cpp builds for a model."""

    kv_class: KvClass  # derived from the ledger's components, not from the architecture's name
    memory_type: str  # llama.cpp's C++ memory type ("" where it cannot be read)
    costs: MemoryCosts


def probe_memory(model: Model, options: Mapping[str, Any]) -> MemoryProbe:
    """Open a one-lane probe context (256 cells) with these options: the KV class of the memory
    llama.cpp builds and what each component costs. UnsupportedMemoryError (a ModelLoadError)
    when skippy cannot count that memory: refused here, before any real context is opened."""
    probe = ContextOptions(**{**options, "n_ctx": 256, "n_seq_max": 1})
    with Context(model, probe) as ctx:
        memory_type = ctx.memory_type()
        check_memory_type(memory_type, model.arch)
        ledger = ctx.ledger()
    kv = derive_class(ledger, arch=model.arch, memory_type=memory_type)
    return MemoryProbe(kv, memory_type, _costs(model, options, ledger))


def measure_costs(model: Model, options: Mapping[str, Any]) -> MemoryCosts:
    """Bytes per attention cell, per sliding-window cell and per recurrent state, on a one-lane probe context."""
    return probe_memory(model, options).costs


def _costs(model: Model, options: Mapping[str, Any], ledger: Ledger) -> MemoryCosts:
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


def size_context(
    model: Model,
    *,
    n_ctx: int | None,
    n_batch: int,
    threads: int | None,
    batch_invariant: bool,
    memory_bytes: int | None = None,
    n_seq_max: int | None = None,
    floor_ctx_per_session: int = 128,
    reserved: int = 0,
    prefix_fraction: float = 0.0,
    context_options: Mapping[str, Any] | None = None,
    cells_cap: int | None = None,
    lanes_cap: int | None = None,
    split: int = 1,
    measure: bool = False,
) -> tuple[LanePlan, ContextOptions]:
    """The lane plan of one context over `model` and the ContextOptions to open it with.

    `n_ctx`, `memory_bytes` and `n_seq_max` are what the user asked for (`--n-ctx`, `--memory`,
    `--n-seq-max`): the pool is `n_ctx`, else the largest the budget holds with its lanes, else
    4096 (pool_cells). `cells_cap` / `lanes_cap` bound the pool and the ceiling from outside (a
    pipeline's stage 0: what the stages below hold); `split` > 1 divides the pool, the budget,
    the requested lanes and the caps among that many equal contexts (a stage 0's groups), and
    the plan and options are each one's. Raises InvalidInputError (PlanError) when nothing fits.
    """
    options = context_base(n_batch, threads, batch_invariant)
    options.update(context_options or {})
    if not options.get("kv_unified", True):
        raise InvalidInputError("the scheduler needs unified KV (one shared cell pool); kv_unified=False is not supported")
    lanes = plan_for(model, options, n_ctx=pool_cells(n_ctx, memory_bytes), requested=n_seq_max, reserved=reserved,
                     floor_ctx_per_session=floor_ctx_per_session, memory_bytes=memory_bytes,
                     prefix_fraction=prefix_fraction, cells_cap=cells_cap, lanes_cap=lanes_cap, split=split,
                     measure=measure)
    return lanes, ContextOptions(**{**options, "n_ctx": lanes.n_ctx, "n_seq_max": lanes.n_seq_max})


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
    cells_cap: int | None = None,
    lanes_cap: int | None = None,
    split: int = 1,
    measure: bool = True,
) -> LanePlan:
    """The plan for `model` under these context options (n_ctx None: derived from memory_bytes).

    With caps and a split, as size_context says: each of `split` contexts gets 1/split of the
    pool, the budget and the requested lanes; its pool is at most cells_cap / split (a derived
    one is re-planned at the cap, within the same budget) and its ceiling at most lanes_cap / split."""
    if not isinstance(split, int) or split < 1:
        raise InvalidInputError(f"split must be an integer >= 1, got {split!r}")
    probe = probe_memory(model, options)
    kv = probe.kv_class
    if not kv.attention:
        # recurrent only: no cell pool to derive from a budget or to divide among sessions; n_ctx
        # only bounds a sequence's positions, and the states the budget holds bound the lanes
        n_ctx = DEFAULT_N_CTX if n_ctx is None else n_ctx
        floor_ctx_per_session = 1
    memory = memory_bytes // split if memory_bytes is not None else None
    pool = n_ctx if n_ctx is None or cells_cap is None else min(n_ctx, cells_cap)
    cap_cells = cells_cap // split if cells_cap is not None else None
    cap_lanes = lanes_cap // split if lanes_cap is not None else None
    if pool is not None:
        pool //= split
    if requested is not None:
        requested //= split
    for what, value in (("cells", pool), ("lanes", requested), ("cells_cap", cap_cells), ("lanes_cap", cap_lanes)):
        if value is not None and value < 1:
            raise PlanError(f"{split} context(s) of {what} {value}: nothing fits")
    costs = probe.costs if measure or kv.recurrent or memory is not None else None

    def plan(cells: int | None, lanes: int | None) -> LanePlan:
        return plan_lanes(kv, cells, options["n_batch"], requested=lanes, reserved=reserved,
                          floor_ctx_per_session=floor_ctx_per_session, costs=costs, memory_bytes=memory,
                          n_ubatch=options.get("n_ubatch"), prefix_fraction=prefix_fraction)

    lanes = plan(pool, requested)
    if cap_cells is not None and lanes.n_ctx > cap_cells:  # a pool derived from the budget, over the cap
        lanes = plan(cap_cells, requested)
    if cap_lanes is not None and lanes.ceiling > cap_lanes:
        lanes = plan(lanes.n_ctx, cap_lanes)
        lanes = attrs.evolve(lanes, reason="lanes_cap" if split == 1 else "lanes_cap / split")
    return lanes
