"""Whole-model batch invariance for each quantization users load: Q4_0, Q4_1, Q4_K_M, Q5_K_M,
Q6_K, Q8_0, F16 and BF16.

The kernel harness (test_matmul_kernels.py) holds each matmul type to the same bytes; this holds
a whole model written in each of llama.cpp's mixtures (its own quantizer, so Q5_K_M really mixes
q5_K with q6_K and the output head gets the type llama.cpp picks), where the norms, attention,
rope and the per-type quantization of activations join in. The llama is 256 wide so every
matrix row holds whole 256-value K-quant super-blocks (a 128-wide one would make the quantizer
fall back to legacy types and the K-quant kernels would never run).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from skippy._lockstep import Seq, alone, run
from skippy.models.synth import TINY, Dims, write_sized
from skippy.native import Context, ContextOptions, Model

pytestmark = pytest.mark.invariance

# the mixture -> the weight type that must be in the file (llama.cpp's mixtures keep some
# tensors in other types, e.g. the output head in q6_K)
QUANTS: dict[str, str] = {
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0",
    "F16": "F16", "BF16": "BF16",
}
WIDE = Dims(n_vocab=TINY.n_vocab, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=768,
            weight_std=TINY.weight_std * (TINY.n_embd / 256) ** 0.5)
N_PROMPTS = 6
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def quant_dir(native_build, tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quants")


@pytest.fixture(scope="module", params=list(QUANTS))
def model_file(request, quant_dir) -> tuple[str, Path]:
    quant = request.param
    return quant, write_sized("llama", quant_dir / f"llama-256-{quant}.gguf", 2, WIDE, seed=3, quant=quant)


def _weight_types(path: Path) -> set[str]:
    return {gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(path).tensors
            if t.name.endswith(".weight") and len(t.shape) == 2}


def test_the_file_holds_the_mixtures_weight_type(model_file):
    quant, path = model_file
    assert QUANTS[quant] in _weight_types(path), f"{quant}: weight types {_weight_types(path)}"


def test_every_sequence_is_its_solo_bytes_under_load(model_file):
    """All prompts in one batch, then staggered with chunked prefill mixed into decodes: each
    sequence's tokens and logits equal its run alone."""
    quant, path = model_file
    rng = np.random.default_rng(11)
    prompts = [rng.integers(260, TINY.n_vocab, size=int(n)).astype(np.int32)
               for n in rng.permutation(np.linspace(5, 70, N_PROMPTS).astype(int))]
    opts = ContextOptions(n_ctx=N_PROMPTS * 128, n_batch=256, n_ubatch=256, n_seq_max=N_PROMPTS,
                          threads=2, batch_invariant=True)
    with Model(path, repack=False) as model, Context(model, opts) as ctx:
        refs = [alone(ctx, p, MAX_TOKENS) for p in prompts]
        scenarios = {
            "one batch": [Seq(p, i) for i, p in enumerate(prompts)],
            "staggered": [Seq(p, i, arrival=2 * i, chunk=9) for i, p in enumerate(prompts)],
        }
        for scenario, seqs in scenarios.items():
            ctx.clear()
            for i, (got, ref) in enumerate(zip(run(ctx, seqs, MAX_TOKENS), refs)):
                assert got.tokens == ref.tokens, f"{quant} {scenario}: sequence {i} tokens differ"
                np.testing.assert_array_equal(got.rows, ref.rows, err_msg=f"{quant} {scenario}: sequence {i}")
