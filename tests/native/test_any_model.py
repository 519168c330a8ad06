"""Any model llama.cpp loads: the engine takes the KV class from the memory llama.cpp built (the
ledger's components and the memory's C++ type), serves the architectures beyond the first five
exactly (batch-invariant: concurrent outputs equal solo runs) and refuses a memory it cannot count."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import skippy
from skippy._generate import generate_tokens
from skippy._plan import context_base, probe_memory
from skippy.errors import ModelLoadError, UnsupportedMemoryError
from skippy.families import KvClass, kv_class
from skippy.native import Context, ContextOptions, Model
from skippy.runtime import ContextRuntime
from skippy.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.native

# the C++ memory type llama.cpp builds for each synthetic family (read from its RTTI)
MEMORY_TYPES = {
    "llama": "llama_kv_cache", "qwen2": "llama_kv_cache", "qwen3": "llama_kv_cache", "qwen3moe": "llama_kv_cache",
    "phi3": "llama_kv_cache", "deepseek2": "llama_kv_cache", "gemma2": "llama_kv_cache_iswa",
    "falcon-h1": "llama_memory_hybrid", "qwen3next": "llama_memory_hybrid", "mamba2": "llama_memory_recurrent",
    "granite": "llama_kv_cache", "olmo2": "llama_kv_cache", "starcoder2": "llama_kv_cache",
    "gpt-oss": "llama_kv_cache_iswa",
}
NEW = ["qwen2", "qwen3", "qwen3moe", "phi3", "mamba2", "granite", "olmo2", "starcoder2", "gpt-oss"]
N_REQUESTS = 4
MAX_TOKENS = 16


def _options(**extra) -> ContextOptions:
    return ContextOptions(**{"n_ctx": 256, "n_batch": 32, "n_ubatch": 32, "n_seq_max": 1, "threads": 1, **extra})


@pytest.mark.parametrize("family", list(MEMORY_TYPES))
def test_the_memory_type_is_what_llama_cpp_built(synth_model_path, family):
    with Model(synth_model_path(family)) as model, Context(model, _options()) as ctx:
        assert ctx.memory_type() == MEMORY_TYPES[family]
        probe = probe_memory(model, context_base(32, 1, False))
        assert probe.memory_type == MEMORY_TYPES[family]
        assert probe.kv_class is kv_class(family)  # the derivation agrees with the name table


def test_the_mamba2_probe_has_no_attention_pool(synth_model_path):
    with Model(synth_model_path("mamba2")) as model:
        probe = probe_memory(model, context_base(32, 1, False))
    assert probe.kv_class is KvClass.RECURRENT
    assert probe.costs.attn_bytes_per_cell == 0 and probe.costs.recurrent_bytes_per_seq > 0


def test_a_model_without_kv_memory_is_refused_at_load(synth_model_path):
    """LLaDA (diffusion, llama's tensors): llama.cpp loads it and builds no memory at all."""
    with Model(synth_model_path("llada")) as model:
        with Context(model, _options()) as ctx:
            assert ctx.memory_type() == "none"
            with pytest.raises(UnsupportedMemoryError, match="no KV memory"):
                ctx.ledger()
        with pytest.raises(UnsupportedMemoryError, match="'none'") as info:
            ContextRuntime(model, _options())
        assert info.value.arch == "llada" and isinstance(info.value, ModelLoadError)


async def test_open_engine_refuses_a_model_without_kv_memory(synth_model_path):
    with trio.fail_after(60):
        with pytest.raises(UnsupportedMemoryError, match="llada"):
            async with skippy.open_engine(synth_model_path("llada"), n_ctx=256, threads=1):
                pass


def _prompts(model: Model) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(260, model.n_vocab, size=n).astype(np.int32) for n in (5, 17, 9, 30)]


def _solo(model: Model, prompts, params) -> list[list[int]]:
    opts = _options(n_ctx=512, batch_invariant=True)
    with Context(model, opts) as ctx:
        out = []
        for p, s in zip(prompts, params):
            ctx.clear()
            out.append(list(generate_tokens(ctx, p, MAX_TOKENS, Sampler(s), stop_at_eog=False)))
        return out


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("family", NEW)
async def test_concurrent_requests_match_their_solo_runs(synth_model_path, family, seeded):
    with Model(synth_model_path(family), repack=False) as model:  # repacked kernels are not batch-invariant
        prompts = _prompts(model)
        params = [SamplingParams(temperature=0.8, top_k=40, seed=100 + i) if seeded else SamplingParams()
                  for i in range(N_REQUESTS)]
        solo = _solo(model, prompts, params)
        outputs: list[list[int]] = [[] for _ in prompts]
        with trio.fail_after(120):
            async with skippy.open_engine(model, n_ctx=512, n_batch=32, n_seq_max=N_REQUESTS, threads=1,
                                          context_options={"batch_invariant": True}) as engine:
                assert engine.runtime.kv_class is kv_class(family)  # derived at load; the table cross-checks

                async def one(i: int) -> None:
                    async for event in engine.generate(prompts[i], params[i], max_tokens=MAX_TOKENS, ignore_eos=True):
                        if event.token is not None:
                            outputs[i].append(event.token)

                async with trio.open_nursery() as nursery:
                    for i in range(N_REQUESTS):
                        nursery.start_soon(one, i)
                stats = engine.stats()
    assert stats.max_running >= 2, "requests really overlapped"
    for i, (got, want) in enumerate(zip(outputs, solo)):
        assert len(got) == MAX_TOKENS
        assert got == want, f"{family}: request {i} differs from its solo run"


async def test_a_recurrent_only_model_reuses_whole_states_exactly(synth_model_path):
    """mamba2 has no cells to share: a prefix is reused only as a whole recorded state (the next
    turn of a chat), and the reused state gives the tokens of a full recompute."""
    with Model(synth_model_path("mamba2"), repack=False) as model:
        rng = np.random.default_rng(5)
        first = [rng.integers(260, model.n_vocab, size=n).astype(np.int32) for n in (40, 33)]
        turns = [np.concatenate([p, rng.integers(260, model.n_vocab, size=7).astype(np.int32)]) for p in first]
        params = [SamplingParams()] * 2
        solo = _solo(model, turns, params)
        with trio.fail_after(120):
            async with skippy.open_engine(model, n_ctx=512, n_batch=32, n_seq_max=4, threads=1, prefix_block=8,
                                          context_options={"batch_invariant": True}) as engine:
                for p in first:  # the first turns leave their states resident
                    async for _ in engine.generate(p, SamplingParams(), max_tokens=2):
                        pass
                await engine.settled()
                outputs = []
                for p, s in zip(turns, params):
                    outputs.append([e.token async for e in engine.generate(p, s, max_tokens=MAX_TOKENS, ignore_eos=True)
                                    if e.token is not None])
                stats = engine.stats()
    assert stats.prefix_hits >= 33, "the second turns were meant to restore the first turns' states"
    assert outputs == solo
