"""The matrix's synthetic models: the base-size builders (MoE MLA, the wide Mamba2 hybrid, the
delta-net hybrid at its interval), the filler vocabulary and both quantizations load in
llama.cpp and generate through skippy with exact lengths.

CI runs the same code path on shrunken shapes (seconds); the real base sizes (~300M parameters,
over a minute each to write on 2 cores, then cached) run only with SKIPPY_BASE_MODELS=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import gguf
import numpy as np
import pytest
import trio

import skippy
from skippy.models import synth, synthetic_model
from skippy.models._quantize import native_quantizer_available

pytestmark = [pytest.mark.bench, pytest.mark.native]

MAX_TOKENS = 6
# the base builders at a width of 256 (K-quant rows stay whole): the same tensors and keys, fewer of them
SHRINK: dict[str, dict] = {
    "deepseek2": dict(n_head=2, n_expert=4, n_expert_used=2),
    "falcon-h1": dict(d_inner=512, n_ssm_head=8),
    "qwen3next": dict(n_k_head=2, n_v_head=4, n_expert=4, n_expert_used=2, n_ff_shexp=256),
}


def shrunk(family: str) -> tuple[int, synth.Dims]:
    _, dims = synth.BASE[family]
    small = attrs.evolve(dims, n_vocab=1024, n_embd=256, n_head=2, n_ff=512, weight_std=0.07,
                         extra={**dims.extra, **SHRINK[family]})
    return (4 if family == "qwen3next" else 2), small  # qwen3next: one full-attention layer at interval 4


async def generate_two(path: Path, budget: float) -> list[list[int]]:
    """Two concurrent requests of MAX_TOKENS with ignore_eos through skippy's engine."""
    outputs: list[list[int]] = [[], []]
    with trio.fail_after(budget):
        async with skippy.open_engine(str(path), n_ctx=512, n_batch=64, n_seq_max=2, threads=2) as engine:
            async def one(i: int) -> None:
                prompt = np.random.default_rng(i).integers(300, 1000, size=20).astype(np.int32)
                async for event in engine.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True):
                    if event.token is not None:
                        outputs[i].append(event.token)

            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(one, i)
    return outputs


QUANTS = ["Q8_0", pytest.param("Q4_K_M", marks=pytest.mark.skipif(
    not native_quantizer_available(), reason="K-quants use the native build's llama_model_quantize"))]


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("family", sorted(synth.BASE))
async def test_base_builders_quantize_load_and_generate(tmp_path: Path, family: str, quant: str):
    n_layer, dims = shrunk(family)
    with trio.fail_after(120):
        path = await trio.to_thread.run_sync(synth.write_sized, family, tmp_path / "m.gguf", n_layer, dims, 0, quant)
    reader = gguf.GGUFReader(path)
    kinds = {t.tensor_type.name for t in reader.tensors}
    assert ("Q4_K" in kinds) if quant == "Q4_K_M" else ("Q8_0" in kinds and "Q4_K" not in kinds)
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 1024  # the filler vocabulary
    if family == "qwen3next":
        assert reader.fields["qwen3next.full_attention_interval"].contents() == 4
    outputs = await generate_two(path, budget=120)
    assert [len(o) for o in outputs] == [MAX_TOKENS, MAX_TOKENS]


def test_tiny_files_are_untouched_by_the_sizes(tmp_path: Path):
    """size="tiny" is the default and writes what write_synthetic always wrote."""
    a = synth.write_synthetic("deepseek2", tmp_path / "a.gguf")
    b = synth.write_synthetic("deepseek2", tmp_path / "b.gguf", size="tiny")
    assert a.read_bytes() == b.read_bytes()
    with pytest.raises(ValueError, match="no base size for 'llama'"):
        synth.write_synthetic("llama", tmp_path / "c.gguf", size="base")


@pytest.mark.skipif(not os.environ.get("SKIPPY_BASE_MODELS"),
                    reason="writing a ~300M base model takes over a minute per family on 2 cores (cached after); "
                           "set SKIPPY_BASE_MODELS=1 (the shrunken test above covers the same code in CI)")
@pytest.mark.parametrize("family", sorted(synth.BASE))
async def test_base_models_load_and_generate(family: str):
    with trio.fail_after(900):
        path = await trio.to_thread.run_sync(lambda: synthetic_model(family, size="base"))
    params = sum(int(np.prod(t.shape)) for t in gguf.GGUFReader(path).tensors)
    assert 200e6 <= params <= 320e6, params
    outputs = await generate_two(path, budget=600)
    assert [len(o) for o in outputs] == [MAX_TOKENS, MAX_TOKENS]
