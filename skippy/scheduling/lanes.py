"""Lane sizing: the sequence ceiling (n_seq_max) is derived, not a hard-coded cap.

Attention lanes are nearly free under unified KV (one shared cell pool), so their
ceiling is the pool divided by a floor of cells per session. Recurrent and hybrid
families allocate a whole state per lane at load, so every lane is paid for in
bytes up front: their ceiling is also bounded by a state budget. Always clamped to
llama.cpp's LLAMA_MAX_SEQ (256) minus reserved ids (e.g. a resident prefix cache).
A full planner (VRAM, multi-stage min) is a later issue; `plan_lanes` is its hook.
"""

from __future__ import annotations

import attrs

from ..families import KvClass

LLAMA_MAX_SEQ = 256


@attrs.frozen
class LanePlan:
    ceiling: int  # sequence ids the scheduler may use: 0..ceiling-1
    n_seq_max: int  # what the context is created with (ceiling + reserved)
    reason: str


def plan_lanes(
    kv_class: KvClass,
    n_ctx: int,
    n_batch: int,
    *,
    requested: int | None = None,
    reserved: int = 0,
    floor_ctx_per_session: int = 128,
    recurrent_bytes_per_seq: float = 0.0,
    recurrent_budget_bytes: float = 256 * 2**20,
) -> LanePlan:
    """The ceiling for this family, context and budget.

    An explicit `requested` replaces the cells-per-session heuristic (admission gates the
    memory anyway) but never the hard limits: LLAMA_MAX_SEQ, n_batch, the recurrent budget.
    """
    states = 0
    if kv_class.recurrent and recurrent_bytes_per_seq > 0:
        states = max(1, int(recurrent_budget_bytes // recurrent_bytes_per_seq))
        reserved = min(reserved, states // 2)  # reserved ids hold a whole state each: at most half the budget
    limits = {
        "LLAMA_MAX_SEQ - reserved": LLAMA_MAX_SEQ - reserved,
        "n_batch (one decode token per lane per step)": n_batch,
    }
    if requested is None:
        limits["n_ctx / floor_ctx_per_session"] = max(1, n_ctx // floor_ctx_per_session)
    if states:
        limits["recurrent state budget / bytes per sequence"] = states - reserved
    if requested is not None:
        limits["requested"] = requested
    reason, ceiling = min(limits.items(), key=lambda kv: kv[1])
    if ceiling < 1:
        raise ValueError(f"no lane fits: {limits}")
    return LanePlan(ceiling, ceiling + reserved, reason)
