"""The KV structural class of a context, derived from the memory llama.cpp actually built.

The class decides what admission must count (attention cells per token, a bounded
sliding window, or a per-sequence recurrent state) and how a prefix may be reused. It is
read off the KV ledger (patch 0001), which reports the components of the memory llama.cpp
created for the model, so any architecture llama.cpp can build gets a class without a
name table; a memory the ledger cannot describe is refused at load, by its C++ type.
`ARCH_CLASSES` is only a cross-check (tests) and a list of families staging knows.
Pure data: costs come from a Ledger measured on a real context, never guessed.
"""

from __future__ import annotations

import enum

import attrs

from .errors import SkippyError, UnsupportedMemoryError
from .kv import ComponentKind, Ledger


class KvClass(enum.Enum):
    DENSE = "dense"  # full attention (GQA, MHA or MLA's one latent K row): one cell per token per sequence
    ISWA = "iswa"  # full attention + sliding-window layers
    HYBRID = "hybrid"  # recurrent layers (Mamba, delta-net, ...) + attention layers
    RECURRENT = "recurrent"  # recurrent layers only (Mamba, RWKV): one state per sequence, no cells per token
    # Aliases for the name table's finer families: the ledger (and so admission, sizing and
    # prefix reuse) cannot tell latent attention from dense, nor one recurrent mixer from another.
    MLA = "dense"  # noqa: PIE796 - an alias on purpose
    SSM_HYBRID = "hybrid"  # noqa: PIE796
    LINEAR_HYBRID = "hybrid"  # noqa: PIE796

    @property
    def components(self) -> tuple[ComponentKind, ...]:
        return _COMPONENTS[self]

    @property
    def recurrent(self) -> bool:
        return ComponentKind.RECURRENT in self.components

    @property
    def attention(self) -> bool:
        """Whether the class has a pool of attention cells (everything but recurrent-only)."""
        return ComponentKind.ATTN in self.components


_COMPONENTS = {
    KvClass.DENSE: (ComponentKind.ATTN,),
    KvClass.ISWA: (ComponentKind.ATTN, ComponentKind.SWA),
    KvClass.HYBRID: (ComponentKind.ATTN, ComponentKind.RECURRENT),
    KvClass.RECURRENT: (ComponentKind.RECURRENT,),
}
_BY_COMPONENTS = {kinds: cls for cls, kinds in _COMPONENTS.items()}

# The C++ memory types patch 0001's ledger describes completely. Any other (a sparse-attention
# indexer cache, hybrid + sliding window, DeepSeek-V4's compressed cache ...) is refused: the
# ledger would under-count it (llama_memory_hybrid_idx derives from llama_memory_hybrid and is
# reported without its indexer cache) or not report it at all.
LEDGER_TYPES = frozenset({"llama_kv_cache", "llama_kv_cache_iswa", "llama_memory_hybrid", "llama_memory_recurrent"})
NO_MEMORY = "none"  # what Context.memory_type() says when llama.cpp builds no memory (encoders, diffusion)


def class_of(kinds: tuple[ComponentKind, ...], *, arch: str = "?", memory_type: str = "") -> KvClass:
    """The class whose components are exactly `kinds`, in the ledger's order."""
    try:
        return _BY_COMPONENTS[kinds]
    except KeyError:
        named = " + ".join(k.name.lower() for k in kinds) or "no components"
        raise UnsupportedMemoryError(
            memory_type or named, arch,
            f"its memory reports {named}, which matches no KV class ({', '.join(c.value for c in _COMPONENTS)})",
        ) from None


def check_memory_type(memory_type: str, arch: str) -> None:
    """Refuse a memory the ledger does not describe completely ('' = type unknown: trust the ledger)."""
    if memory_type == NO_MEMORY:
        raise UnsupportedMemoryError(memory_type, arch, "llama.cpp builds no KV memory for it (an encoder, "
                                     "embedding or diffusion model); skippy serves causal generation only")
    if memory_type and memory_type not in LEDGER_TYPES:
        raise UnsupportedMemoryError(memory_type, arch, "the KV ledger cannot describe this memory type, so "
                                     "admission could not count it")


def derive_class(ledger: Ledger, *, arch: str = "?", memory_type: str = "") -> KvClass:
    """The class of the context whose ledger this is; UnsupportedMemoryError if it has none."""
    check_memory_type(memory_type, arch)
    return class_of(tuple(c.kind for c in ledger.components), arch=arch, memory_type=memory_type)


# -- the name table: a cross-check of the derivation, and the families staging knows -------------

ARCH_CLASSES: dict[str, KvClass] = {
    "llama": KvClass.DENSE,
    "qwen2": KvClass.DENSE,
    "qwen3": KvClass.DENSE,
    "qwen3moe": KvClass.DENSE,
    "phi3": KvClass.DENSE,
    "mistral": KvClass.DENSE,
    "gemma2": KvClass.ISWA,
    "gemma3": KvClass.ISWA,
    "deepseek2": KvClass.DENSE,  # MLA: one latent K row per token
    "falcon-h1": KvClass.HYBRID,
    "qwen3next": KvClass.HYBRID,
    "mamba2": KvClass.RECURRENT,
    "granite": KvClass.DENSE,
    "olmo2": KvClass.DENSE,
    "starcoder2": KvClass.DENSE,
    "gpt-oss": KvClass.ISWA,  # sliding-window layers with attention sinks, global layers between
}


class UnknownArchitecture(SkippyError, LookupError):
    """An architecture the name table does not list (the engine never needs the table)."""


def kv_class(arch: str) -> KvClass:
    """The class the name table expects for `arch` (a cross-check; the engine derives it)."""
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


def memory_profile(ledger: Ledger, *, arch: str = "?") -> MemoryProfile:
    """Derive the class from the measured components and price them."""
    cls = derive_class(ledger, arch=arch)
    return MemoryProfile(cls, tuple(ComponentCost(c.kind, c.size, c.bytes) for c in ledger.components))
