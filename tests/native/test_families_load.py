"""Every synthetic architecture loads, reports its memory components, and decodes deterministically;
the class derived from the components agrees with the name table (a cross-check only)."""

from __future__ import annotations

import pytest

from skippy._generate import generate_tokens
from skippy.families import KvClass, kv_class, memory_profile
from skippy.kv import ComponentKind
from skippy.native import Context, ContextOptions, Model

pytestmark = pytest.mark.native

EXPECTED = {
    "llama": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "gemma2": (KvClass.ISWA, (ComponentKind.ATTN, ComponentKind.SWA)),
    "deepseek2": (KvClass.DENSE, (ComponentKind.ATTN,)),  # MLA: one latent K row per token
    "falcon-h1": (KvClass.HYBRID, (ComponentKind.ATTN, ComponentKind.RECURRENT)),
    "qwen3next": (KvClass.HYBRID, (ComponentKind.ATTN, ComponentKind.RECURRENT)),
    "qwen2": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "qwen3": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "qwen3moe": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "phi3": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "mamba2": (KvClass.RECURRENT, (ComponentKind.RECURRENT,)),
    "granite": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "olmo2": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "starcoder2": (KvClass.DENSE, (ComponentKind.ATTN,)),
    "gpt-oss": (KvClass.ISWA, (ComponentKind.ATTN, ComponentKind.SWA)),  # sliding-window layers with sinks
}
PROMPT = "Once upon a time there was a small robot"


def _greedy_twice(model: Model, n_seq_max: int = 2) -> tuple[list[int], list[int], Context]:
    runs = []
    for _ in range(2):
        ctx = Context(model, ContextOptions(n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=n_seq_max, threads=1))
        prompt = model.tokenizer.tokenize(PROMPT)
        runs.append(list(generate_tokens(ctx, prompt, 16, stop_at_eog=False)))
        ledger = ctx.ledger()
        ctx.close()
    return runs[0], runs[1], ledger


def test_every_synthetic_family_is_covered():
    from skippy.models.synth import FAMILIES

    assert set(EXPECTED) == set(FAMILIES)


@pytest.mark.parametrize("family", list(EXPECTED))
def test_synthetic_family_loads_and_decodes_deterministically(synth_model_path, family):
    cls, components = EXPECTED[family]
    with Model(synth_model_path(family)) as model:
        assert model.arch == family
        assert kv_class(model.arch) is cls
        first, second, ledger = _greedy_twice(model)
        assert first == second
        assert len(first) == 16
        assert len(set(first)) > 1, "random weights should not collapse to one token"
        profile = memory_profile(ledger, arch=model.arch)
        assert profile.kv_class is cls
        assert tuple(c.kind for c in profile.components) == components
        assert (profile.bytes_per_token > 0) == cls.attention
        if cls.recurrent:
            assert profile.bytes_per_sequence > 0
            assert ledger.get(ComponentKind.RECURRENT).size == 2  # one state slot per n_seq_max


@pytest.mark.parametrize(
    "name, arch, cls",
    [("smollm2", "llama", KvClass.DENSE), ("gemma3", "gemma3", KvClass.ISWA)],
)
def test_real_model_loads_and_decodes_deterministically(request, name, arch, cls):
    path = request.getfixturevalue(f"{name}_path")
    with Model(path) as model:
        assert model.arch == arch
        first, second, ledger = _greedy_twice(model, n_seq_max=1)
        assert first == second
        assert memory_profile(ledger).kv_class is cls is kv_class(arch)
        text = model.tokenizer.detokenize(first)
        assert text.strip(), "a real model continues the story with some text"
