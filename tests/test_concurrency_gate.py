"""The concurrency gate: a long prompt is prefilled in chunks while every decoding sequence keeps
getting a token every step. Asserted in steps, not seconds; on the fake runtime and on the real library.
(How fast the prompt goes is the latency targets' business, scheduling.slo: it gets the slack the
streams leave, so it may still be prefilling when they end.)"""

from __future__ import annotations

import pytest
import trio

import skippy
from skippy.testing import FakeRuntime, open_fake_engine

SHORT = 12
LONG = SHORT * 20


def prompt(i: int, n: int) -> list[int]:
    return [(i * 17 + 3 * k) % 50 + 1 for k in range(n)]


async def gate(model, **config) -> None:
    reports = []
    with trio.fail_after(30):
        opener = open_fake_engine if isinstance(model, FakeRuntime) else skippy.open_engine
        async with opener(model, on_step=reports.append, **config) as engine:
            ids = {}

            async def run(name, p, max_tokens):
                stream = engine.generate(p, max_tokens=max_tokens)
                ids[name] = stream.request.id
                async for _ in stream:
                    pass

            async with trio.open_nursery() as nursery:
                for i in range(7):
                    nursery.start_soon(run, i, prompt(i, SHORT), 40)
                while not reports or reports[-1].decode_tokens < 7:  # all short ones are decoding
                    await trio.sleep(0.001)
                nursery.start_soon(run, "long", prompt(99, LONG), 4)

    long_id = ids["long"]
    prefill_steps = [r for r in reports if long_id in r.prefill_ids]
    assert len(prefill_steps) >= 4, "the long prompt is chunked across steps"
    for name, rid in ids.items():
        if name == "long":
            continue
        decoded = [r.step for r in reports if rid in r.decode_ids]
        # once decoding, a session gets a token in every step until it finishes: no step skips it
        assert decoded == list(range(decoded[0], decoded[0] + len(decoded))), (name, decoded)
        assert decoded[0] < prefill_steps[0].step
        during = [r.step for r in prefill_steps if r.step <= decoded[-1]]
        assert during and all(s in decoded for s in during), (name, during)  # no stream skipped for the prompt
    for r in prefill_steps:
        assert long_id not in r.decode_ids
        assert r.prefill_tokens + r.decode_tokens <= 32
    assert any(r.mixed for r in prefill_steps)
    steps = [r.step for r in prefill_steps]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "no step without progress in between"


async def test_concurrency_gate_on_the_fake_runtime():
    await gate(FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=8), n_batch=32)


@pytest.mark.native
async def test_concurrency_gate_on_llama(synth_model_path):
    # targets every stream meets: with ones derived from a 1 ms step, a stream a loaded box slows past its
    # TPOT is late, and a late stream decodes only in time on-time work leaves (scheduling.budget), by design
    await gate(synth_model_path("llama"), n_ctx=1024, n_batch=32, n_seq_max=8, threads=1,
               ttft_slo_ms=60_000, tpot_slo_ms=10_000)
