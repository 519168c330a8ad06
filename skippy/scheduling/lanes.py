"""Lane sizing: the context size and the sequence ceiling are derived, not configured caps.

One memory budget pays for every component llama.cpp allocates at load:
- attention cells: one pool of n_ctx cells shared by every sequence (unified KV). Its
  sessions' share is the pool minus the prefix cache's budget (a co-tenant of the same
  cells), divided by a floor of cells per session;
- sliding-window cells (ISWA): about a window per sequence, so each lane costs a window;
- recurrent states (hybrid families): a whole state per sequence id, lanes and reserved
  ids alike, allocated up front: each lane is paid for in bytes.
The ceiling is the smallest of what the budget, the pool, one decode token per lane per
step (n_batch) and llama.cpp's LLAMA_MAX_SEQ (256) minus the reserved ids allow.
`skippy plan` prints the same plan the engine uses.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from ..errors import InvalidInputError
from ..families import KvClass
from ..kv import ComponentKind

LLAMA_MAX_SEQ = 256
PAD = 256  # llama.cpp pads its KV caches to 256 cells
# Recurrent states, when no memory budget is given: a cap, not an allocation (llama.cpp allocates
# n_seq_max states, and the ceiling is the least of every limit). At 256 MiB a Falcon-H1-0.5B-shaped
# model (12.3 MiB a state) got 12 lanes where llama-server -np 32 runs 32 (bench/results/gate-matrix,
# ssm-hybrid at N=32: 0.80x its throughput); 1 GiB leaves the pool's own ceiling in charge there.
DEFAULT_STATE_BUDGET = 1 << 30


def _pad(n: int) -> int:
    return -(-n // PAD) * PAD


@attrs.frozen
class MemoryCosts:
    """Bytes per unit of each component, measured on a real context (never guessed)."""

    attn_bytes_per_cell: float
    swa_bytes_per_cell: float = 0.0
    n_swa: int = 0
    recurrent_bytes_per_seq: float = 0.0
    swa_full: bool = False

    def bytes(self, n_ctx: int, n_seq_max: int, n_ubatch: int) -> dict[ComponentKind, int]:
        """What llama.cpp allocates for this context (its own sizing rules, llama-kv-cache-iswa.cpp)."""
        out = {ComponentKind.ATTN: int(self.attn_bytes_per_cell * n_ctx)}
        if self.swa_bytes_per_cell:
            cells = n_ctx if self.swa_full else _pad(min(n_ctx, self.n_swa * n_seq_max + n_ubatch))
            out[ComponentKind.SWA] = int(self.swa_bytes_per_cell * cells)
        if self.recurrent_bytes_per_seq:
            out[ComponentKind.RECURRENT] = int(self.recurrent_bytes_per_seq * n_seq_max)
        return out


@attrs.frozen
class LanePlan:
    ceiling: int  # sequence ids the scheduler may use: 0..ceiling-1
    n_seq_max: int  # what the context is created with (ceiling + reserved)
    reason: str  # the limit that decided the ceiling
    n_ctx: int = 0
    reserved: int = 0  # ids kept for the resident prefix cache
    prefix_budget_tokens: int = 0
    bytes: Mapping[ComponentKind, int] = attrs.field(factory=dict)
    memory_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


class PlanError(InvalidInputError):
    """The budget cannot hold even one lane."""


def plan_lanes(
    kv_class: KvClass,
    n_ctx: int | None,
    n_batch: int,
    *,
    requested: int | None = None,
    reserved: int = 0,
    floor_ctx_per_session: int = 128,
    costs: MemoryCosts | None = None,
    memory_bytes: int | None = None,
    n_ubatch: int | None = None,
    prefix_fraction: float = 0.0,
    max_ctx: int = 1 << 20,
) -> LanePlan:
    """The plan for this family and budget; n_ctx None derives it from `memory_bytes`.

    An explicit `requested` replaces the cells-per-session heuristic (admission gates the
    memory anyway) but never the hard limits: LLAMA_MAX_SEQ, n_batch, the budget.
    """
    n_ubatch = n_ubatch or n_batch
    costs = costs or MemoryCosts(0.0)
    if n_ctx is None:
        if memory_bytes is None:
            raise PlanError("give a context size or a memory budget")
        n_ctx = _largest_ctx(kv_class, n_batch, requested, reserved, floor_ctx_per_session, costs, memory_bytes,
                             n_ubatch, prefix_fraction, max_ctx)
    return _plan(kv_class, n_ctx, n_batch, requested, reserved, floor_ctx_per_session, costs, memory_bytes, n_ubatch,
                 prefix_fraction)


def _plan(kv_class: KvClass, n_ctx: int, n_batch: int, requested: int | None, reserved: int, floor: int,
          costs: MemoryCosts, memory: int | None, n_ubatch: int, prefix_fraction: float) -> LanePlan:
    per_seq = costs.recurrent_bytes_per_seq if kv_class.recurrent else 0.0
    states = None
    if per_seq:
        fixed = costs.bytes(n_ctx, 0, n_ubatch)
        fixed.pop(ComponentKind.RECURRENT, None)
        left = memory - sum(fixed.values()) if memory is not None else DEFAULT_STATE_BUDGET
        states = max(0, int(left // per_seq))
        reserved = min(reserved, states // 2)  # reserved ids hold a whole state each: at most half
    prefix_tokens = int(n_ctx * prefix_fraction) if reserved else 0
    limits = {
        "LLAMA_MAX_SEQ - reserved": LLAMA_MAX_SEQ - reserved,
        "n_batch (one decode token per lane per step)": n_batch,
    }
    if requested is None:
        limits["(n_ctx - prefix cache budget) / floor_ctx_per_session"] = max(1, (n_ctx - prefix_tokens) // floor)
    else:
        limits["requested"] = requested
    if states is not None:
        budget = "memory budget" if memory is not None else "default state budget"
        limits[f"{budget} / recurrent state bytes - reserved"] = states - reserved
    reason, ceiling = min(limits.items(), key=lambda kv: kv[1])
    if costs.swa_bytes_per_cell and memory is not None:  # each lane also costs a window of SWA cells
        while ceiling >= 1 and sum(costs.bytes(n_ctx, ceiling + reserved, n_ubatch).values()) > memory:
            ceiling, reason = ceiling - 1, "memory budget (sliding-window cells per lane)"
    if ceiling < 1:
        raise PlanError(f"no lane fits: {limits}")
    used = costs.bytes(n_ctx, ceiling + reserved, n_ubatch)
    if memory is not None and sum(used.values()) > memory:
        raise PlanError(f"n_ctx={n_ctx} alone needs {sum(used.values())} bytes, over the budget of {memory}")
    return LanePlan(ceiling, ceiling + reserved, reason, n_ctx, reserved, prefix_tokens, used, memory)


def _largest_ctx(kv_class: KvClass, n_batch: int, requested: int | None, reserved: int, floor: int,
                 costs: MemoryCosts, memory: int, n_ubatch: int, prefix_fraction: float, max_ctx: int) -> int:
    """The largest n_ctx (a multiple of 256) whose plan fits the budget with every lane the pool
    supports (bisection, plans grow with n_ctx): a bigger pool that leaves the budget too short for
    its own lanes (recurrent states, window cells) is not better."""

    def fits(n_ctx: int) -> bool:
        try:
            plan = _plan(kv_class, n_ctx, n_batch, requested, reserved, floor, costs, memory, n_ubatch,
                         prefix_fraction)
        except PlanError:
            return False
        return "memory" not in plan.reason or n_ctx == PAD

    lo, hi = 0, max_ctx // PAD
    if not fits(PAD):
        raise PlanError(f"a memory budget of {memory} bytes does not hold even {PAD} cells and one lane")
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * PAD
