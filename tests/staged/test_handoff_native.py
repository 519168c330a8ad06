"""Patch 0006 on the real library: a model split into layer-range stages, hidden states handed
from stage to stage, gives the full model's logits and tokens bit for bit (the seed design's
"activation handoff matches full model"), per family, with each side fed in its own chunks."""

from __future__ import annotations

import numpy as np
import pytest

from skippy.errors import InvalidBatchError, InvalidInputError, ModelLoadError
from skippy.native import Batch, Context, ContextOptions, Model
from skippy.staged import PINNED_SPLITS

pytestmark = [pytest.mark.staged, pytest.mark.native]

SYNTH = ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next", "qwen2", "qwen3", "qwen3moe", "phi3"]
# the pinned splits of skippy.staged, as boundaries; plus SmolLM2 cut after its first and before its last layer
SPLITS = {name: {k: [0, *(b for _, b in ranges)] for k, ranges in splits.items()} for name, splits in PINNED_SPLITS.items()}
EDGES = [0, 1, 29, 30]
PROMPT = 37
GEN = 8


def _model_path(name, request, synth_model_path):
    if name in ("smollm2", "gemma3"):
        return request.getfixturevalue(f"{name}_path")
    return synth_model_path(name, deep=True)


def _options() -> ContextOptions:
    return ContextOptions(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=1, threads=2, batch_invariant=True)


def _prompt(model: Model) -> np.ndarray:
    low, high = (1000, 20000) if model.n_vocab > 30000 else (260, model.n_vocab)
    return np.random.default_rng(5).integers(low, high, size=PROMPT).astype(np.int32)


def _full(path) -> tuple[list[int], np.ndarray]:
    with Model(path, repack=False) as model, Context(model, _options()) as ctx:
        prompt = _prompt(model)
        batch = Batch(64)
        for lo in range(0, PROMPT - 16, 16):  # the full model in chunks of 16, the stages otherwise
            ctx.decode(batch.set(prompt[lo:lo + 16], np.arange(lo, lo + 16), 0))
        lo = (PROMPT - 1) // 16 * 16
        rows = [ctx.decode(batch.set(prompt[lo:], np.arange(lo, PROMPT), 0)).copy()[-1]]
        tokens = [int(np.argmax(rows[-1]))]
        for i in range(GEN - 1):
            rows.append(ctx.decode(batch.set([tokens[-1]], [PROMPT + i], 0)).copy()[-1])
            tokens.append(int(np.argmax(rows[-1])))
    return tokens, np.array(rows)


def _staged(path, bounds: list[int]) -> tuple[list[int], np.ndarray]:
    """Each stage takes the previous one's hidden states in chunks of its own size."""
    models = [Model(path, repack=False, layers=(a, b)) for a, b in zip(bounds, bounds[1:])]
    contexts = [Context(m, _options()) for m in models]
    try:
        prompt = _prompt(models[0])
        batch = Batch(64)

        def run(tokens: np.ndarray, start: int) -> np.ndarray:
            hidden = contexts[0].decode(batch.set(tokens, np.arange(start, start + tokens.size), 0)).copy()
            for k, ctx in enumerate(contexts[1:], start=1):
                chunk = 5 + 6 * k  # 11, 17, ...: other cuts than the stage before
                parts = []
                for lo in range(0, hidden.shape[0], chunk):
                    part = hidden[lo:lo + chunk]
                    pos = np.arange(start + lo, start + lo + part.shape[0])
                    parts.append(ctx.decode(batch.set_hidden(part, pos, 0)).copy())
                hidden = np.concatenate(parts)  # the last stage: logits of each part's last token
            return hidden[-1]

        rows = [run(prompt, 0)]  # stage 0 takes the prompt in one go
        tokens = [int(np.argmax(rows[-1]))]
        for i in range(GEN - 1):
            rows.append(run(np.array([tokens[-1]], dtype=np.int32), PROMPT + i))
            tokens.append(int(np.argmax(rows[-1])))
        return tokens, np.array(rows)
    finally:
        for ctx in contexts:
            ctx.close()
        for m in models:
            m.close()


@pytest.mark.parametrize(("name", "split"), [
    *((name, k) for name in [*SYNTH, "smollm2", "gemma3"] for k in (2, 3)), ("smollm2", "edges"),
])
def test_handoff_matches_the_full_model(name, split, request, synth_model_path):
    path = _model_path(name, request, synth_model_path)
    full_tokens, full_rows = _full(path)
    tokens, rows = _staged(path, EDGES if split == "edges" else SPLITS[name][split])
    assert tokens == full_tokens
    np.testing.assert_array_equal(rows, full_rows)


def test_a_stage_holds_only_its_layers_weights(synth_model_path):
    path = synth_model_path("llama", deep=True)
    with Model(path, repack=False) as full:
        whole = full.loaded_bytes
        assert whole == full.size_bytes  # the whole model holds every tensor of the file
    sizes = []
    for a, b in [(0, 2), (2, 4), (4, 6)]:
        with Model(path, repack=False, layers=(a, b)) as stage:
            sizes.append(stage.loaded_bytes)
    # each stage: its 2 of 6 layers, plus the token embeddings (first) or output head (last)
    assert all(s < whole * 0.6 for s in sizes), (sizes, whole)
    assert sizes[1] < min(sizes[0], sizes[2]), sizes  # the middle stage has neither


@pytest.mark.parametrize("layers", [(0, 0), (3, 2), (-1, 2)])
def test_an_empty_range_is_refused_before_loading(layers, synth_model_path):
    with pytest.raises(InvalidInputError, match="layer range"):
        Model(synth_model_path("llama", deep=True), layers=layers)


def test_a_range_past_the_last_layer_is_refused_by_llama(synth_model_path):
    with pytest.raises(ModelLoadError, match=r"as a stage of layers \[4, 7\)"):
        Model(synth_model_path("llama", deep=True), layers=(4, 7))


@pytest.mark.parametrize("name", ["granite", "starcoder2"])
def test_an_architecture_without_stage_support_is_refused_by_name(name, synth_model_path):
    """Patch 0006/0007 admit the builders they adapted; any other architecture loaded as a stage
    is refused at load (before a tensor is made), with its name in the error."""
    with pytest.raises(ModelLoadError, match=rf"arch '{name}'.*as a stage of layers \[0, 1\)"):
        Model(synth_model_path(name, deep=True), layers=(0, 1))


def test_a_later_stage_refuses_tokens_and_a_first_stage_refuses_hidden_states(synth_model_path):
    path = synth_model_path("llama", deep=True)
    with Model(path, repack=False, layers=(3, 6)) as later, Context(later, _options()) as ctx:
        with pytest.raises(InvalidBatchError, match="hidden states"):
            ctx.decode(Batch(8).set([300, 301], [0, 1], 0))
    with Model(path, repack=False, layers=(0, 3)) as first, Context(first, _options()) as ctx:
        with pytest.raises(InvalidBatchError, match="tokens"):
            ctx.decode(Batch(8).set_hidden(np.zeros((2, first.n_embd), np.float32), [0, 1], 0))


@pytest.mark.parametrize("name", SYNTH)
def test_a_stages_memory_holds_only_its_layers(name, synth_model_path):
    """KV and recurrent buffers (from the memory ledger) of the stages add up to the full model's."""
    path = synth_model_path(name, deep=True)

    def component_bytes(layers) -> dict:
        with Model(path, repack=False, layers=layers) as m, Context(m, _options()) as ctx:
            return {c.kind: c.bytes for c in ctx.ledger().components}

    bounds = SPLITS[name][3]
    full = component_bytes(None)
    stages = [component_bytes((a, b)) for a, b in zip(bounds, bounds[1:])]
    for kind, total in full.items():
        parts = [s.get(kind, 0) for s in stages]
        assert sum(parts) == total, (kind, parts, total)
        assert max(parts) < total, (kind, parts)
