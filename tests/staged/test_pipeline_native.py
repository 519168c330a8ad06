"""A served pipeline on the real library: stages with their own schedulers over TCP.

- N concurrent sessions through 2 and 3 stages get, each, the tokens they get alone in one
  process (greedy and sampled), per family;
- the chain is checked at Hello (model, layer ranges, a stage without --next) and a malformed
  frame is refused with an Error frame while the stage keeps serving;
- stage processes killed mid-run fail their in-flight requests with a clear error and no
  hang, and the pipeline serves again when the stage is back (test_pipeline_faults_native.py).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio

from skippy.engine import open_engine
from skippy.errors import StageUnavailableError
from skippy.staged import PINNED_SPLITS, VERSION, Error, FrameStream, Hello, connect
from skippy.staged._pipeline import open_pipeline
from skippy.staged._stage import StageRuntime, serve_stage

pytestmark = [pytest.mark.staged, pytest.mark.native]

SYNTH = ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next"]
N_CTX, N_BATCH = 1024, 64
GREEDY = {}
SAMPLED = {"temperature": 0.8, "top_k": 40, "seed": 11}


def _path(name, request, synth_model_path):
    if name in ("smollm2", "gemma3"):
        return request.getfixturevalue(f"{name}_path")
    return synth_model_path(name, deep=True)


def _prompts(n: int, vocab_low: int) -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [rng.integers(vocab_low, vocab_low + 200, size=int(rng.integers(3, 40))).tolist() for _ in range(n)]


async def _generate(engine, prompt, sampling, max_tokens):
    tokens = []
    async for event in engine.generate(prompt, sampling, max_tokens=max_tokens, ignore_eos=True):
        if event.token is not None:
            tokens.append(event.token)
        if event.final:
            assert event.finish_reason == "length", event
    return tokens


async def _concurrently(engine, prompts, sampling, max_tokens):
    out = [None] * len(prompts)

    async def one(i):
        out[i] = await _generate(engine, prompts[i], sampling, max_tokens)

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return out


@asynccontextmanager
async def _stages(path, splits):
    """Stages 1..K-1 served in this process (their own contexts and schedulers): (runtimes, port of stage 1)."""
    runtimes = [StageRuntime(path, layers, n_ctx=N_CTX, n_batch=N_BATCH, threads=2) for layers in splits[1:]]
    try:
        async with trio.open_nursery() as nursery:
            port = None
            for rt in reversed(runtimes):
                port = await nursery.start(serve_stage, rt, "127.0.0.1", 0,
                                           None if port is None else ("127.0.0.1", port))
            yield runtimes, port
            nursery.cancel_scope.cancel()
    finally:
        for rt in runtimes:
            rt.close()


# Gemma-3 at 3 stages only (each stage then holds one of its global-attention layers; 2 stages
# would add 40 s of CI for no new case)
CASES = [(name, k) for name in SYNTH + ["smollm2"] for k in (2, 3)] + [("gemma3", 3)] + [(name, 3) for name in ("qwen3moe", "phi3")]


@pytest.mark.parametrize(("name", "n_stages"), CASES)
async def test_sessions_through_the_pipeline_get_their_solo_tokens(name, n_stages, request, synth_model_path):
    path = _path(name, request, synth_model_path)
    n, max_tokens = {"smollm2": (6, 6), "gemma3": (4, 5)}.get(name, (8, 10))
    prompts = _prompts(n, 1000 if name in ("smollm2", "gemma3") else 260)
    with trio.fail_after(600):
        async with open_engine(path, n_ctx=N_CTX, n_batch=N_BATCH, threads=2, prefix_cache=False) as engine:
            solo = {kind: [await _generate(engine, p, s, max_tokens) for p in prompts]
                    for kind, s in (("greedy", GREEDY), ("sampled", SAMPLED))}
        splits = PINNED_SPLITS[name][n_stages]
        async with _stages(path, splits) as (runtimes, port):
            async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                     threads=2) as engine:
                assert engine.pipeline.n_stages == n_stages
                assert engine.lanes.ceiling <= min(rt.lanes for rt in runtimes)
                for kind, sampling in (("greedy", GREEDY), ("sampled", SAMPLED)):
                    got = await _concurrently(engine, prompts, sampling, max_tokens)
                    assert got == solo[kind], kind
                # every later stage freed the finished requests' cells
                await trio.sleep(0.2)
                assert all(v == 0 for rt in runtimes for v in rt.ctx.ledger().used.values())


async def test_the_pipeline_ceiling_is_the_weakest_stage(synth_model_path):
    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][3]
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            weak = StageRuntime(path, splits[2], n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=3, threads=1)
            port = await nursery.start(serve_stage, weak, "127.0.0.1", 0, None)
            mid = StageRuntime(path, splits[1], n_ctx=N_CTX, n_batch=N_BATCH, threads=1)
            port = await nursery.start(serve_stage, mid, "127.0.0.1", 0, ("127.0.0.1", port))
            async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                     threads=1) as engine:
                assert (mid.lanes, weak.lanes) == (8, 3)
                assert engine.pipeline.lanes_below == 3 and engine.lanes.ceiling == 3
                got = await _concurrently(engine, _prompts(7, 260), GREEDY, 4)  # 7 sessions, 3 at a time
                assert all(len(t) == 4 for t in got)
                assert engine.stats().finished["length"] == 7
            nursery.cancel_scope.cancel()
        weak.close()
        mid.close()


async def _hello(stream: FrameStream, hello: Hello):
    await stream.send(hello)
    return await stream.receive()


async def test_the_chain_is_checked_at_hello(synth_model_path):
    path = synth_model_path("llama", deep=True)
    other = synth_model_path("llama", seed=1, deep=True)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            middle = StageRuntime(path, (2, 4), n_ctx=N_CTX, n_batch=N_BATCH, threads=1)
            port = await nursery.start(serve_stage, middle, "127.0.0.1", 0, None)  # ends at 4 of 6: no --next
            with pytest.raises(StageUnavailableError, match="ends at layer 4 of 6 and has no --next"):
                async with open_pipeline(path, 2, ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH):
                    pass
            with pytest.raises(StageUnavailableError, match="layer ranges must meet"):
                async with open_pipeline(path, 3, ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH):
                    pass
            with pytest.raises(StageUnavailableError, match="model mismatch"):
                async with open_pipeline(other, 2, ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH):
                    pass
            nursery.cancel_scope.cancel()
        middle.close()
    with trio.fail_after(30), pytest.raises(StageUnavailableError, match="unreachable"):
        async with open_pipeline(path, 2, ("127.0.0.1", 1), n_ctx=N_CTX, n_batch=N_BATCH, connect_timeout=5):
            pass


async def test_a_malformed_frame_is_refused_and_the_stage_serves_on(synth_model_path):
    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][2]
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            last = StageRuntime(path, splits[1], n_ctx=N_CTX, n_batch=N_BATCH, threads=1)
            port = await nursery.start(serve_stage, last, "127.0.0.1", 0, None)
            # garbage instead of a Hello
            raw = await trio.open_tcp_stream("127.0.0.1", port)
            await raw.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = await FrameStream(raw).receive()
            assert isinstance(reply, Error) and reply.code == "bad_frame" and "bad magic" in reply.message
            await raw.aclose()
            # a good Hello, then a frame of an unknown kind mid-session
            link = await connect("127.0.0.1", port)
            hello = await _hello(link, Hello(0, 1, 0, 3, 6, last.model.n_embd, last.digest))
            assert isinstance(hello, Hello) and (hello.layer_begin, hello.layer_end, hello.n_stages) == (3, 6, 2)
            await link.stream.send_all(b"SKPF" + VERSION.to_bytes(2, "little") + (99).to_bytes(2, "little")
                                       + (0).to_bytes(8, "little"))
            reply = await link.receive()
            assert isinstance(reply, Error) and reply.code == "bad_frame" and "unknown frame kind 99" in reply.message
            assert await link.receive() is None  # that session ended...
            await link.aclose()
            # ...and the stage serves the next one
            async with open_pipeline(path, 3, ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH, threads=1) as engine:
                got = await _concurrently(engine, _prompts(2, 260), GREEDY, 3)
                assert [len(t) for t in got] == [3, 3]
            nursery.cancel_scope.cancel()
        last.close()


async def test_f16_on_the_wire_serves_and_a_bad_wire_dtype_is_refused(synth_model_path):
    """f16 halves the bytes between stages; it is not bit-exact, so only serving is asserted here
    (and that the default f32 is what the exact-parity tests above run on)."""
    from skippy.errors import InvalidInputError

    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][2]
    with trio.fail_after(120):
        async with _stages(path, splits) as (runtimes, port):
            async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                     wire_dtype="f16") as engine:
                assert engine.runtime.wire_dtype == np.float16
                got = await _concurrently(engine, _prompts(3, 260), GREEDY, 4)
                assert [len(t) for t in got] == [4, 4, 4]
            with pytest.raises(InvalidInputError, match="wire_dtype"):
                async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                         wire_dtype="bf16"):
                    pass


@pytest.mark.parametrize("name", ["llama", "falcon-h1"])
async def test_groups_interleave_steps_and_keep_solo_tokens(name, synth_model_path):
    """Two engines over one link (cross-step pipelining): each session still gets its solo
    tokens, the sessions spread over both groups, and the merged stats count them all."""
    from skippy.staged._groups import PipelineEngine

    path = synth_model_path(name, deep=True)
    prompts = _prompts(8, 260)
    with trio.fail_after(300):
        async with open_engine(path, n_ctx=N_CTX, n_batch=N_BATCH, threads=2, prefix_cache=False) as engine:
            solo = [await _generate(engine, p, SAMPLED, 8) for p in prompts]
        splits = PINNED_SPLITS[name][3]
        async with _stages(path, splits) as (runtimes, port):
            async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                     threads=1, groups=2) as engine:
                assert isinstance(engine, PipelineEngine) and len(engine.engines) == 2
                assert engine.lanes.ceiling == sum(e.lanes.ceiling for e in engine.engines) <= runtimes[0].lanes
                assert all(e.runtime.n_ctx == N_CTX // 2 for e in engine.engines)
                assert await _concurrently(engine, prompts, SAMPLED, 8) == solo
                per_group = [e.stats().finished["length"] for e in engine.engines]
                assert per_group == [4, 4]
                stats = engine.stats()
                assert stats.finished["length"] == 8 and stats.submitted == 8


async def test_groups_are_refused_beyond_the_lanes(synth_model_path):
    from skippy.errors import InvalidInputError

    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][2]
    with trio.fail_after(60):
        async with _stages(path, splits) as (runtimes, port):
            for groups, match in ((0, "groups must be"), (9, "9 groups need at least 9 lanes")):
                with pytest.raises(InvalidInputError, match=match):
                    async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                             groups=groups):
                        pass


def test_a_stage_sizes_its_pool_like_the_engine(synth_model_path):
    """`skippy stage` without --n-ctx: 4096 cells, as `skippy serve`; with a memory budget, derived."""
    path = synth_model_path("llama", deep=True)
    default = StageRuntime(path, (2, 4))
    budgeted = StageRuntime(path, (2, 4), memory_bytes=1 << 20)
    try:
        assert default.cells == 4096
        assert budgeted.plan.memory_bytes == 1 << 20 and budgeted.cells != 4096
    finally:
        default.close()
        budgeted.close()
