"""The KV ledger as plain data: what each memory component holds, reported with every step."""

from __future__ import annotations

import enum

import attrs


class ComponentKind(enum.IntEnum):
    """Matches `enum llama_memory_component_kind` in patches/0001-memory-ledger.patch."""

    ATTN = 0
    SWA = 1
    RECURRENT = 2


@attrs.frozen
class MemoryComponent:
    kind: ComponentKind
    size: int  # cells (attention: tokens; recurrent: sequence state slots)
    # cells owned by at least one sequence; a shared cell counts once. For SWA this
    # includes out-of-window cells not yet recycled: llama.cpp reuses them lazily, and
    # sizes the component (window x sequences + ubatch) so every sequence always fits.
    used: int
    bytes: int  # bytes of the component's buffers

    @property
    def free(self) -> int:
        return self.size - self.used

    @property
    def bytes_per_cell(self) -> float:
        return self.bytes / self.size if self.size else 0.0


@attrs.frozen
class Ledger:
    components: tuple[MemoryComponent, ...]

    def get(self, kind: ComponentKind) -> MemoryComponent | None:
        for component in self.components:
            if component.kind == kind:
                return component
        return None

    @property
    def used(self) -> dict[ComponentKind, int]:
        return {c.kind: c.used for c in self.components}
