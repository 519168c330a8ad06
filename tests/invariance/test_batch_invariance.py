"""A sequence's greedy tokens and logits are the same bytes alone or under any load.

With `batch_invariant` on every scenario must match its solo reference exactly. With it off
the tests only record how many sequences differ (see the summary at the end of the run), so
the report shows what the option buys.
"""

from __future__ import annotations

import numpy as np
import pytest

from skippy.native import Context, ContextOptions, Model

from skippy._lockstep import Seq, alone, run

pytestmark = pytest.mark.invariance

MODELS = ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next", "smollm2", "gemma3"]
N_PROMPTS = 8
MAX_TOKENS = 48
N_CTX = 8 * 640  # > 512 cells per sequence, all sequences in one unified pool
CHUNKINGS = (1, 7, 16, 64)


@pytest.fixture(scope="module", params=MODELS)
def model_path(request, synth_model_path):
    if request.param in ("smollm2", "gemma3"):
        return request.param, request.getfixturevalue(f"{request.param}_path")
    return request.param, synth_model_path(request.param)


@pytest.fixture(scope="module", params=[True, False], ids=["on", "off"])
def setup(request, model_path):
    """(name, invariant, ctx, prompts, references) for one model and mode."""
    name, path = model_path
    invariant = request.param
    # the repacked kernels are not batch-invariant; the fast default keeps them
    with Model(path, repack=not invariant) as model:
        opts = ContextOptions(
            n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_seq_max=N_PROMPTS + 2,
            threads=2 if name in ("smollm2", "gemma3") else 1, batch_invariant=invariant,
        )
        with Context(model, opts) as ctx:
            low, high = (1000, 20000) if name in ("smollm2", "gemma3") else (260, model.n_vocab)
            rng = np.random.default_rng(7)
            lengths = rng.permutation(np.linspace(5, 90, N_PROMPTS).astype(int))
            prompts = [rng.integers(low, high, size=n).astype(np.int32) for n in lengths]
            references = [alone(ctx, p, MAX_TOKENS) for p in prompts]
            yield name, invariant, ctx, prompts, references


def _compare(record, setup, scenario: str, results, references) -> None:
    name, invariant, *_ = setup
    differ = sum(
        r.tokens != ref.tokens or not np.array_equal(r.rows, ref.rows) for r, ref in zip(results, references)
    )
    record(name, invariant, scenario, differ, len(results))
    if invariant:
        for i, (r, ref) in enumerate(zip(results, references)):
            assert r.tokens == ref.tokens, f"{name} {scenario}: sequence {i} tokens differ"
            np.testing.assert_array_equal(r.rows, ref.rows, err_msg=f"{name} {scenario}: sequence {i} logits differ")


def test_all_in_one_batch(invariance_record, setup):
    _, _, ctx, prompts, refs = setup
    ctx.clear()
    results = run(ctx, [Seq(p, i) for i, p in enumerate(prompts)], MAX_TOKENS)
    _compare(invariance_record, setup, "one batch", results, refs)


def test_staggered_chunked_prefill_mixed_with_decodes(invariance_record, setup):
    _, _, ctx, prompts, refs = setup
    ctx.clear()
    seqs = [Seq(p, i, arrival=3 * i, chunk=16) for i, p in enumerate(prompts)]
    results = run(ctx, seqs, MAX_TOKENS)
    _compare(invariance_record, setup, "staggered", results, refs)


def test_shared_prefix_through_seq_cp(invariance_record, setup):
    """One sequence prefills a common prefix, three more share its cells via seq_cp."""
    name, invariant, ctx, prompts, _ = setup
    prefix = prompts[0][:24] if prompts[0].size >= 24 else np.resize(prompts[0], 24)
    full = [np.concatenate([prefix, p[:12]]) for p in prompts[:4]]
    refs = [alone(ctx, f, MAX_TOKENS) for f in full]
    ctx.clear()
    run(ctx, [Seq(prefix, 0)], 1)  # prefill the prefix on seq 0
    ctx.seq_rm(0, prefix.size, -1)  # keep exactly the prefix (drop the one decoded token)
    for i in range(1, 4):
        ctx.seq_cp(0, i)
    seqs = [Seq(f, i, start=prefix.size, chunk=16) for i, f in enumerate(full)]
    results = run(ctx, seqs, MAX_TOKENS)
    _compare(invariance_record, setup, "seq_cp prefix", results, refs)


def test_sequence_on_a_freed_seq_id(invariance_record, setup):
    """A request starts on a seq id whose cells another request left behind, mid-load."""
    _, _, ctx, prompts, refs = setup
    ctx.clear()
    first = [Seq(p, i) for i, p in enumerate(prompts[:4])]
    run(ctx, first, 10)  # four requests run for a while, leaving cells all over the pool
    ctx.seq_rm(2)  # one finishes; its seq id and cells are freed
    others = first[:2] + first[3:]
    newcomer = Seq(prompts[5], 2, chunk=16)
    results = run(ctx, others + [newcomer], MAX_TOKENS)
    _compare(invariance_record, setup, "freed seq id", [results[-1]], [refs[5]])


@pytest.mark.parametrize("chunk", CHUNKINGS)
def test_prompt_chunking(invariance_record, setup, chunk):
    _, _, ctx, prompts, refs = setup
    longest = int(np.argmax([p.size for p in prompts]))
    result = alone(ctx, prompts[longest], MAX_TOKENS, chunk=chunk)
    _compare(invariance_record, setup, f"chunk {chunk}", [result], [refs[longest]])
