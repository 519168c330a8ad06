"""GGUF architecture -> KV structural class -> memory components and their costs.

The class decides what admission must count (attention cells per token, a bounded
sliding window, or a per-sequence recurrent state) and how a prefix may be reused.
Pure data: costs come from a Ledger measured on a real context, never guessed.
"""

from __future__ import annotations

import enum

import attrs

from .kv import ComponentKind, Ledger


class KvClass(enum.Enum):
    DENSE = "dense"  # full attention, GQA: one cell per token per sequence, shareable
    ISWA = "iswa"  # full attention + sliding-window layers
    MLA = "mla"  # latent attention: one (compressed) K cell per token
    SSM_HYBRID = "ssm-hybrid"  # Mamba-style recurrent layers + attention layers
    LINEAR_HYBRID = "linear-hybrid"  # linear-attention (delta-net) recurrent layers + attention layers

    @property
    def components(self) -> tuple[ComponentKind, ...]:
        return _COMPONENTS[self]

    @property
    def recurrent(self) -> bool:
        return ComponentKind.RECURRENT in self.components


_COMPONENTS = {
    KvClass.DENSE: (ComponentKind.ATTN,),
    KvClass.ISWA: (ComponentKind.ATTN, ComponentKind.SWA),
    KvClass.MLA: (ComponentKind.ATTN,),
    KvClass.SSM_HYBRID: (ComponentKind.ATTN, ComponentKind.RECURRENT),
    KvClass.LINEAR_HYBRID: (ComponentKind.ATTN, ComponentKind.RECURRENT),
}

ARCH_CLASSES: dict[str, KvClass] = {
    "llama": KvClass.DENSE,
    "qwen2": KvClass.DENSE,
    "qwen3": KvClass.DENSE,
    "mistral": KvClass.DENSE,
    "gemma2": KvClass.ISWA,
    "gemma3": KvClass.ISWA,
    "deepseek2": KvClass.MLA,
    "falcon-h1": KvClass.SSM_HYBRID,
    "qwen3next": KvClass.LINEAR_HYBRID,
}


class UnknownArchitecture(KeyError):
    pass


def kv_class(arch: str) -> KvClass:
    try:
        return ARCH_CLASSES[arch]
    except KeyError:
        raise UnknownArchitecture(f"no KV class recorded for architecture {arch!r}") from None


@attrs.frozen
class ComponentCost:
    kind: ComponentKind
    cells: int
    bytes: int

    @property
    def per_cell(self) -> float:
        """Bytes per token (attention, SWA) or per sequence state (recurrent)."""
        return self.bytes / self.cells if self.cells else 0.0


@attrs.frozen
class MemoryProfile:
    kv_class: KvClass
    components: tuple[ComponentCost, ...]

    def cost(self, kind: ComponentKind) -> ComponentCost | None:
        return next((c for c in self.components if c.kind == kind), None)

    @property
    def bytes_per_token(self) -> float:
        """What one more token of one sequence costs in unbounded (full-attention) memory."""
        attn = self.cost(ComponentKind.ATTN)
        return attn.per_cell if attn else 0.0

    @property
    def bytes_per_sequence(self) -> float:
        """What one more sequence costs up front in recurrent state, whatever its length."""
        rec = self.cost(ComponentKind.RECURRENT)
        return rec.per_cell if rec else 0.0


def memory_profile(arch: str, ledger: Ledger) -> MemoryProfile:
    """Check the measured components against the class and price them."""
    cls = kv_class(arch)
    measured = tuple(c.kind for c in ledger.components)
    if measured != cls.components:
        raise ValueError(f"{arch}: memory reports {measured}, class {cls.value} expects {cls.components}")
    return MemoryProfile(cls, tuple(ComponentCost(c.kind, c.size, c.bytes) for c in ledger.components))
