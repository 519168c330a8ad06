"""The KV-class table and the pricing of measured ledgers (pure: no native library)."""

from __future__ import annotations

import pytest

from skippy.families import KvClass, UnknownArchitecture, kv_class, memory_profile
from skippy.kv import ComponentKind, Ledger, MemoryComponent


def test_each_class_names_its_components():
    assert kv_class("llama").components == (ComponentKind.ATTN,)
    assert kv_class("gemma3").components == (ComponentKind.ATTN, ComponentKind.SWA)
    assert kv_class("deepseek2") is KvClass.MLA
    assert kv_class("falcon-h1").recurrent and kv_class("qwen3next").recurrent
    assert not kv_class("gemma2").recurrent


def test_unknown_architecture_is_named():
    with pytest.raises(UnknownArchitecture, match="mamba9"):
        kv_class("mamba9")


def test_profile_prices_tokens_and_sequences():
    ledger = Ledger((
        MemoryComponent(ComponentKind.ATTN, size=1024, used=10, bytes=1024 * 64),
        MemoryComponent(ComponentKind.RECURRENT, size=4, used=1, bytes=4 * 1000),
    ))
    profile = memory_profile("falcon-h1", ledger)
    assert profile.bytes_per_token == 64
    assert profile.bytes_per_sequence == 1000


def test_profile_rejects_a_ledger_that_contradicts_the_class():
    ledger = Ledger((MemoryComponent(ComponentKind.ATTN, 16, 0, 16),))
    with pytest.raises(ValueError, match="expects"):
        memory_profile("gemma2", ledger)


def test_ledger_lookup_and_free():
    attn = MemoryComponent(ComponentKind.ATTN, size=100, used=30, bytes=400)
    ledger = Ledger((attn,))
    assert ledger.get(ComponentKind.ATTN).free == 70
    assert ledger.get(ComponentKind.SWA) is None
