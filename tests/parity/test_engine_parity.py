"""Exact-output parity through the engine: with batch-invariant execution, requests arriving
staggered among others (and preempted, then recomputed) produce the tokens each produces alone."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import skippy
from skippy._generate import generate_tokens
from skippy.native import Context, ContextOptions, Model
from skippy.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.parity

MODELS = ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next", "smollm2", "gemma3"]
REAL = ("smollm2", "gemma3")
N_REQUESTS = 8


@pytest.fixture(scope="module", params=MODELS)
def model(request, synth_model_path):
    name = request.param
    path = request.getfixturevalue(f"{name}_path") if name in REAL else synth_model_path(name)
    with Model(path, repack=False) as m:  # the repacked kernels are not batch-invariant
        yield name, m


def _params(n: int, seeded: bool, first_seed: int) -> list[SamplingParams]:
    """Greedy, or top-k/top-p sampling with a seed of its own per request."""
    return [SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=first_seed + i) if seeded else SamplingParams()
            for i in range(n)]


def _workload(name: str, model: Model, seeded: bool, shortest: int = 4, longest: int = 60):
    rng = np.random.default_rng(11)
    low, high = (1000, 20000) if name in REAL else (260, model.n_vocab)
    lengths = rng.permutation(np.linspace(shortest, longest, N_REQUESTS).astype(int))
    prompts = [rng.integers(low, high, size=n).astype(np.int32) for n in lengths]
    return prompts, _params(N_REQUESTS, seeded, 1000)


def _solo(model: Model, threads: int, prompts, params, max_tokens: int) -> list[list[int]]:
    opts = ContextOptions(n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=1, threads=threads, batch_invariant=True)
    with Context(model, opts) as ctx:
        return [list(generate_tokens(ctx, p, max_tokens, Sampler(s))) for p, s in zip(prompts, params)]


async def _through_engine(model: Model, threads: int, prompts, params, max_tokens: int, n_ctx: int,
                          stagger: int = 3, **config):
    steps = 0

    def on_step(report) -> None:
        nonlocal steps
        steps = report.step

    outputs: list[list[int]] = [[] for _ in prompts]
    # loose targets: a target derived on a slow box makes requests late, and late ones wait for a lane,
    # which would undo the overlap and the preemption these parity runs are built to force
    config.setdefault("ttft_slo_ms", 60000)
    config.setdefault("tpot_slo_ms", 10000)
    with trio.fail_after(240):
        async with skippy.open_engine(
            model, n_ctx=n_ctx, n_batch=64, n_seq_max=N_REQUESTS, threads=threads, decode_reserve=4,
            context_options={"batch_invariant": True}, on_step=on_step, **config,
        ) as engine:

            async def one(i: int) -> None:
                while steps < stagger * i:  # staggered: each request arrives a few steps after the last
                    await trio.sleep(0.001)
                async for event in engine.generate(prompts[i], params[i], max_tokens=max_tokens):
                    if event.token is not None:
                        outputs[i].append(event.token)
                    assert event.finish_reason in (None, "stop", "length"), event

            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
            stats = engine.stats()
    return outputs, stats


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
async def test_staggered_requests_match_their_solo_runs(model, seeded):
    name, m = model
    threads = 2 if name in REAL else 1
    max_tokens = 12 if name in REAL else 32
    prompts, params = _workload(name, m, seeded)
    solo = _solo(m, threads, prompts, params, max_tokens)
    outputs, stats = await _through_engine(m, threads, prompts, params, max_tokens, n_ctx=2048)
    assert stats.max_running >= 4, "requests really overlapped"
    for i, (got, want) in enumerate(zip(outputs, solo)):
        assert got == want, f"{name}: request {i} differs from its solo run"


async def test_preempted_requests_recompute_to_the_same_tokens(model):
    name, m = model
    threads = 2 if name in REAL else 1
    max_tokens = 32
    # prompts of 100-120 tokens in a 256-cell pool: admission can start two at once (prompt +
    # reserve fits), and two growing by 28 tokens each no longer fit, so preemption is certain
    # whenever two overlap, whatever the arrival timing (a small per-session floor lets 8 lanes exist)
    prompts, params = _workload(name, m, seeded=True, shortest=100, longest=120)
    solo = _solo(m, threads, prompts, params, max_tokens)
    outputs, stats = await _through_engine(m, threads, prompts, params, max_tokens, n_ctx=256, stagger=0,
                                           floor_ctx_per_session=16)
    assert stats.preemptions > 0, "the pool was meant to be too small"
    for i, (got, want) in enumerate(zip(outputs, solo)):
        assert got == want, f"{name}: request {i} differs from its solo run after preemption"


def _prefix_workload(name: str, model: Model, seeded: bool):
    """Six prompts over one system prompt, then two that continue earlier ones (the next turn of a
    chat: the only reuse a recurrent state allows, besides the system prompt's snapshot)."""
    rng = np.random.default_rng(5)
    low, high = (1000, 20000) if name in REAL else (260, model.n_vocab)
    system = rng.integers(low, high, size=40).astype(np.int32)
    prompts = [np.concatenate([system, rng.integers(low, high, size=n).astype(np.int32)]) for n in (4, 9, 6, 12, 5, 8)]
    prompts += [np.concatenate([prompts[i], rng.integers(low, high, size=7).astype(np.int32)]) for i in (0, 1)]
    return prompts, _params(len(prompts), seeded, 2000)


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
async def test_prefix_hits_give_the_tokens_of_a_full_recompute(model, seeded):
    """Shared cells (live, in-batch, resident, recurrent snapshots) change no token."""
    name, m = model
    threads = 2 if name in REAL else 1
    max_tokens = 12 if name in REAL else 24
    prompts, params = _prefix_workload(name, m, seeded)
    solo = _solo(m, threads, prompts, params, max_tokens)
    outputs, stats = await _through_engine(m, threads, prompts, params, max_tokens, n_ctx=2048, stagger=4,
                                           prefix_block=8)
    assert stats.prefix_hits >= 40, f"{name}: the workload was meant to hit the cache"
    for i, (got, want) in enumerate(zip(outputs, solo)):
        assert got == want, f"{name}: request {i} differs from its solo run"
