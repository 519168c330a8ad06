"""The KV class derived from a ledger's components, the name table, and the pricing (pure: no native library)."""

from __future__ import annotations

import pytest

from skippy.errors import SkippyError, UnsupportedMemoryError
from skippy.families import (
    ARCH_CLASSES,
    LEDGER_TYPES,
    KvClass,
    UnknownArchitecture,
    class_of,
    derive_class,
    kv_class,
    memory_profile,
)
from skippy.kv import ComponentKind, Ledger, MemoryComponent

ATTN, SWA, REC = ComponentKind.ATTN, ComponentKind.SWA, ComponentKind.RECURRENT


def _ledger(*kinds: ComponentKind) -> Ledger:
    return Ledger(tuple(MemoryComponent(k, size=16, used=0, bytes=16 * 8) for k in kinds))


@pytest.mark.parametrize("kinds, cls", [
    ((ATTN,), KvClass.DENSE), ((ATTN, SWA), KvClass.ISWA), ((ATTN, REC), KvClass.HYBRID), ((REC,), KvClass.RECURRENT),
])
def test_the_class_is_the_components(kinds, cls):
    assert class_of(kinds) is cls
    assert derive_class(_ledger(*kinds)) is cls
    assert cls.components == kinds
    assert cls.recurrent == (REC in kinds) and cls.attention == (ATTN in kinds)


@pytest.mark.parametrize("kinds", [(), (SWA,), (SWA, ATTN), (ATTN, SWA, REC), (ATTN, ATTN)])
def test_components_of_no_class_are_refused_by_name(kinds):
    with pytest.raises(UnsupportedMemoryError, match="matches no KV class") as info:
        derive_class(_ledger(*kinds), arch="odd")
    assert info.value.arch == "odd" and isinstance(info.value, SkippyError)


@pytest.mark.parametrize("memory_type", ["llama_kv_cache_dsa", "llama_memory_hybrid_iswa", "llama_memory_hybrid_idx"])
def test_a_memory_type_the_ledger_does_not_describe_is_refused_even_if_it_reports(memory_type):
    # llama_memory_hybrid_idx derives from llama_memory_hybrid: the ledger reports attn + recurrent
    # for it, without its indexer cache; only the type tells
    assert memory_type not in LEDGER_TYPES
    with pytest.raises(UnsupportedMemoryError, match=memory_type) as info:
        derive_class(_ledger(ATTN, REC), arch="glm5-next", memory_type=memory_type)
    assert info.value.memory_type == memory_type


def test_no_memory_at_all_is_refused():
    with pytest.raises(UnsupportedMemoryError, match="no KV memory"):
        derive_class(_ledger(), arch="llada", memory_type="none")


def test_the_ledger_types_and_an_unknown_type_are_trusted():
    for memory_type in (*LEDGER_TYPES, ""):  # "": the type could not be read; the ledger decides
        assert derive_class(_ledger(ATTN), memory_type=memory_type) is KvClass.DENSE


def test_old_names_are_aliases_of_what_the_ledger_can_tell():
    assert KvClass.MLA is KvClass.DENSE
    assert KvClass.SSM_HYBRID is KvClass.HYBRID and KvClass.LINEAR_HYBRID is KvClass.HYBRID
    assert list(KvClass) == [KvClass.DENSE, KvClass.ISWA, KvClass.HYBRID, KvClass.RECURRENT]


def test_the_name_table_is_a_cross_check():
    assert kv_class("llama").components == (ATTN,)
    assert kv_class("gemma3").components == (ATTN, SWA)
    assert kv_class("falcon-h1").recurrent and kv_class("qwen3next").recurrent
    assert kv_class("mamba2") is KvClass.RECURRENT
    assert set(ARCH_CLASSES.values()) == set(KvClass)


def test_unknown_architecture_is_a_named_skippy_error():
    with pytest.raises(UnknownArchitecture, match="mamba9") as info:
        kv_class("mamba9")
    assert isinstance(info.value, SkippyError)
    assert str(info.value) == "no KV class recorded for architecture 'mamba9'"  # not KeyError's quoted repr


def test_profile_prices_tokens_and_sequences():
    ledger = Ledger((
        MemoryComponent(ATTN, size=1024, used=10, bytes=1024 * 64),
        MemoryComponent(REC, size=4, used=1, bytes=4 * 1000),
    ))
    profile = memory_profile(ledger)
    assert profile.kv_class is KvClass.HYBRID
    assert profile.bytes_per_token == 64
    assert profile.bytes_per_sequence == 1000


def test_a_recurrent_only_profile_costs_nothing_per_token():
    profile = memory_profile(Ledger((MemoryComponent(REC, size=2, used=0, bytes=2 * 500),)))
    assert profile.kv_class is KvClass.RECURRENT
    assert profile.bytes_per_token == 0 and profile.bytes_per_sequence == 500


def test_ledger_lookup_and_free():
    attn = MemoryComponent(ATTN, size=100, used=30, bytes=400)
    ledger = Ledger((attn,))
    assert ledger.get(ATTN).free == 70
    assert ledger.get(SWA) is None
