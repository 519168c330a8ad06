"""The engine on the real library: every KV family, SmolLM2, preemption and cancellation against real memory."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import skippy
from skippy._generate import generate_tokens
from skippy.kv import ComponentKind
from skippy.native import Context, ContextOptions, Model

pytestmark = pytest.mark.native

FAMILIES = ("llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next")


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """Loaded once (a few seconds): engines borrow it and leave it open."""
    with Model(smollm2_path) as model:
        yield model


def prompt(i: int, n: int = 12) -> list[int]:
    return [300 + (i * 7 + 3 * k) % 200 for k in range(n)]


async def run_all(engine, specs):
    out = [None] * len(specs)

    async def one(i, p, kw):
        out[i] = [e async for e in engine.generate(p, **kw)]

    async with trio.open_nursery() as nursery:
        for i, (p, kw) in enumerate(specs):
            nursery.start_soon(one, i, p, kw)
    return out


async def assert_only_resident_prefixes_hold_memory(engine):
    """No lane keeps a cell once its request is over and the engine settled; what stays is the prefix cache's."""
    await engine.settled()
    ctx = engine.runtime.ctx
    assert [s for s in range(engine.lanes.ceiling) if ctx.seq_pos_max(s) != -1] == []
    assert engine.runtime.ledger().get(ComponentKind.ATTN).used <= engine.stats().prefix_resident_tokens


@pytest.mark.parametrize("family", FAMILIES)
async def test_concurrent_requests_on_every_family(family, synth_model_path):
    with trio.fail_after(30):
        async with skippy.open_engine(synth_model_path(family), n_ctx=512, n_batch=64, n_seq_max=4, threads=1) as engine:
            specs = [(prompt(i, 6 + 5 * i), {"max_tokens": 6 + 2 * i}) for i in range(6)]
            results = await run_all(engine, specs)
            stats = engine.stats()
            ledger = engine.runtime.ledger()
            await assert_only_resident_prefixes_hold_memory(engine)
    for (p, _), events in zip(specs, results):
        assert events[-1].finish_reason in ("length", "stop")
        assert events[-1].usage.prompt_tokens == len(p)
        assert events[-1].usage.completion_tokens == len([e for e in events if e.token is not None])
    assert stats.max_running == 4 and stats.mixed_steps > 0
    assert set(ledger.used) == set(skippy.families.kv_class(engine.runtime.arch).components)


async def test_recurrent_families_pay_for_every_lane(synth_model_path):
    """Under one memory budget a hybrid's ceiling is bounded by its per-sequence state; a dense one's is not."""
    from skippy._plan import measure_costs

    with Model(synth_model_path("falcon-h1"), repack=False) as m:
        costs = measure_costs(m, {"n_batch": 256, "n_ubatch": 256, "threads": 1})
    budget = int(costs.attn_bytes_per_cell * 4096 + 2.5 * costs.recurrent_bytes_per_seq)  # the pool and 2.5 states
    with trio.fail_after(30):
        async with skippy.open_engine(synth_model_path("falcon-h1"), n_ctx=4096, n_batch=256, threads=1,
                                      memory_bytes=budget) as engine:
            assert engine.lanes.ceiling == 1 and "recurrent" in engine.lanes.reason
            assert engine.lanes.reserved == 1  # a resident prefix holds a state too
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=4096, n_batch=256, threads=1,
                                      memory_bytes=budget) as engine:
            assert engine.lanes.ceiling == (4096 - 2048) // 128  # the prefix cache's half is a co-tenant


@pytest.mark.parametrize("family", ["llama", "falcon-h1"])
async def test_alone_in_the_engine_equals_the_solo_reference(family, synth_model_path):
    p = np.array(prompt(1, 20), dtype=np.int32)
    with Model(synth_model_path(family)) as model:
        opts = ContextOptions(n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=4, threads=1)
        with Context(model, opts) as ctx:
            solo = list(generate_tokens(ctx, p, 12))
        with trio.fail_after(30):
            async with skippy.open_engine(model, n_ctx=512, n_batch=64, n_seq_max=4, threads=1) as engine:
                events = [e async for e in engine.generate(p, max_tokens=12)]
    assert [e.token for e in events] == solo[: len(events)]


async def test_preemption_and_cancellation_on_real_memory(synth_model_path):
    reports = []
    with trio.fail_after(30):
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=256, n_batch=64, n_seq_max=4, threads=1,
                                      decode_reserve=2, floor_ctx_per_session=16, on_step=reports.append,
                                      # loose targets: on a slow box a derived target makes the fourth request
                                      # late, and a late request waits for a lane instead of forcing preemption
                                      ttft_slo_ms=60000, tpot_slo_ms=10000) as engine:
            specs = [(prompt(i, 40), {"max_tokens": 40}) for i in range(4)]
            results = await run_all(engine, specs)
            assert engine.stats().preemptions > 0
            for events in results:
                assert [e.index for e in events] == list(range(40)) and events[-1].finish_reason == "length"

            stream = engine.generate(prompt(9, 30), max_tokens=100)
            with trio.CancelScope() as scope:
                async for event in stream:
                    if event.index == 3:
                        scope.cancel()
            steps = engine.stats().steps
            await run_all(engine, [(prompt(10, 4), {"max_tokens": 3})])  # a couple more steps
            assert engine.stats().steps >= steps + 2
            await assert_only_resident_prefixes_hold_memory(engine)
    assert all(r.kv_used[ComponentKind.ATTN] <= 256 for r in reports)


async def test_smollm2_serves_concurrent_sessions(smollm2):
    texts = ["Once upon a time,", "The capital of France is", "def fibonacci(n):", "Bees communicate by"]
    with trio.fail_after(60):
        async with skippy.open_engine(smollm2, n_ctx=1024, n_batch=128, threads=1) as engine:
            results = await run_all(engine, [(t, {"max_tokens": 8}) for t in texts])
            stats = engine.stats()
    for events in results:
        assert events[-1].final and events[-1].finish_reason in ("length", "stop")
        assert "".join(e.text for e in events).strip()
    assert stats.max_running == 4 and stats.finished["length"] + stats.finished["stop"] == 4
    assert not smollm2.closed  # borrowed, not owned


async def test_the_runtime_owner_shares_cells_on_request(synth_model_path):
    """The prefix-sharing hook: a copy shares cells, so the ledger does not grow."""
    from skippy.actors._mail import call
    from skippy.scheduling.effects import ReadLedger, ShareCells

    with trio.fail_after(30):
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=512, n_batch=64, n_seq_max=4, threads=1) as engine:
            engine.runtime.decode(np.array(prompt(1, 20), dtype=np.int32), np.arange(20, dtype=np.int32),
                                  np.full(20, 3, dtype=np.int32), np.zeros(20, dtype=np.int8))
            before = await call(engine._runtime_tx, ReadLedger())
            shared = await call(engine._runtime_tx, ShareCells(3, 2, 12))
            assert shared.granted == 12
            assert before.get(ComponentKind.ATTN).used == shared.ledger.get(ComponentKind.ATTN).used == 20
            assert engine.runtime.ctx.seq_pos_max(2) == 11
            # more than the source holds: nothing is shared
            refused = await call(engine._runtime_tx, ShareCells(3, 1, 21))
            assert refused.granted == 0 and engine.runtime.ctx.seq_pos_max(1) == -1


async def test_the_event_loop_runs_while_llama_decode_computes(smollm2):
    """cffi releases the GIL in llama_decode: trio tasks tick while a real step is in its thread."""
    import time

    windows: list[tuple[float, float]] = []
    ticks: list[float] = []
    with trio.fail_after(60):
        async with skippy.open_engine(smollm2, n_ctx=1024, n_batch=256, threads=1) as engine:
            decode = engine.runtime.decode

            def timed(*args):
                start = time.perf_counter()
                try:
                    return decode(*args)
                finally:
                    windows.append((start, time.perf_counter()))

            engine.runtime.decode = timed
            done = trio.Event()

            async def ticker():
                while not done.is_set():
                    ticks.append(time.perf_counter())
                    await trio.sleep(0)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)
                async for _ in engine.generate(long_prompt, max_tokens=2):
                    pass
                done.set()
    start, end = windows[0]  # the ~200-token prefill
    assert sum(start < t < end for t in ticks) >= 3


async def test_unified_kv_cannot_be_turned_off(synth_model_path):
    with pytest.raises(skippy.InvalidInputError, match="unified"):
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=256, threads=1,
                                      context_options={"kv_unified": False}):
            pass
