"""Projection of KV cells per memory component: what a request will need, what is promised.

The ledger says what the memory holds after the last step; admitted requests that
have not finished prefilling hold promises the ledger cannot see yet. Admission gates
on ledger free minus those promises, per component:

- ATTN: one cell per token of every sequence (shared prefix cells count once).
- SWA: never gated. Its `used` counts out-of-window cells llama.cpp recycles lazily,
  and llama.cpp sizes it (window x n_seq_max + ubatch) so every sequence fits: a
  free sequence id is room enough.
- RECURRENT: one state slot per sequence, whatever its length.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import attrs

from ..kv import ComponentKind, Ledger
from .requests import Request

GATED = (ComponentKind.ATTN, ComponentKind.RECURRENT)


def reserve_of(request: Request, decode_reserve: int) -> int:
    """Decode cells promised beyond the prompt: a small reserve, or all of them once pinned."""
    return request.remaining if request.pinned else min(decode_reserve, request.remaining)


def need(request: Request, decode_reserve: int) -> dict[ComponentKind, int]:
    """What admitting `request` (fresh or resumed) takes from each component.

    A shared prefix is already in memory (its source holds it), so it costs nothing more."""
    return {
        ComponentKind.ATTN: request.n_tokens + reserve_of(request, decode_reserve) - request.held,
        ComponentKind.RECURRENT: 1,
    }


def promised(request: Request, decode_reserve: int) -> dict[ComponentKind, int]:
    """What a running request will still take that the ledger does not show yet."""
    return {
        ComponentKind.ATTN: max(0, request.n_tokens + reserve_of(request, decode_reserve) - request.held),
        ComponentKind.RECURRENT: 1 if request.cached == 0 else 0,
    }


@attrs.frozen
class Headroom:
    """Free cells per gated component once every promise is kept."""

    free: Mapping[ComponentKind, int]

    @classmethod
    def of(cls, ledger: Ledger, running: Iterable[Request], decode_reserve: int) -> "Headroom":
        free = {c.kind: c.free for c in ledger.components if c.kind in GATED}
        for request in running:
            for kind, cells in promised(request, decode_reserve).items():
                if kind in free:
                    free[kind] -= cells
        return cls(free)

    def fits(self, cells: Mapping[ComponentKind, int]) -> bool:
        return all(self.free[k] >= n for k, n in cells.items() if k in self.free)

    def missing(self, cells: Mapping[ComponentKind, int]) -> dict[ComponentKind, int]:
        return {k: n - self.free[k] for k, n in cells.items() if k in self.free and n > self.free[k]}

    def take(self, cells: Mapping[ComponentKind, int]) -> "Headroom":
        return Headroom({k: v - cells.get(k, 0) for k, v in self.free.items()})


def step_need(new_tokens: int, new_sequences: int) -> dict[ComponentKind, int]:
    """Cells one step writes: a cell per token, a recurrent slot per sequence starting from empty."""
    return {ComponentKind.ATTN: new_tokens, ComponentKind.RECURRENT: new_sequences}


def shortfall(ledger: Ledger, cells: Mapping[ComponentKind, int]) -> dict[ComponentKind, int]:
    """Cells missing per component for a step to fit the memory as it is now (empty = fits)."""
    out = {}
    for c in ledger.components:
        if c.kind in GATED and cells.get(c.kind, 0) > c.free:
            out[c.kind] = cells[c.kind] - c.free
    return out
