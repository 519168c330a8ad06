"""A pipeline whose stages share a secret, on the real library: still bit-exact with one process,
strangers refused mid-run without disturbing it, and a missing secret on either side refused."""

from __future__ import annotations

import pytest
import trio

from skippy.engine import open_engine
from skippy.errors import StageUnavailableError
from skippy.staged import PINNED_SPLITS, Auth, Error, Hello, connect
from skippy.staged._auth import _UPSTREAM, mac
from skippy.staged._pipeline import open_pipeline
from skippy.staged._stage import StageRuntime, serve_stage

from .test_pipeline_native import (
    GREEDY,
    N_BATCH,
    N_CTX,
    SAMPLED,
    _concurrently,
    _generate,
    _prompts,
)

pytestmark = [pytest.mark.staged, pytest.mark.native]

SECRET = b"a shared stage secret, 32 bytes!"


async def _stranger(port: int, runtime: StageRuntime, stage: int) -> Error:
    """A peer that says the right Hello but proves a wrong secret."""
    link = await connect("127.0.0.1", port)
    hello = Hello(stage, stage + 1, 0, runtime.layers[0], runtime.model.n_layer, runtime.model.n_embd,
                  runtime.digest, nonce=b"\x01" * 32)
    await link.send(hello)
    challenge = await link.receive()
    assert isinstance(challenge, Auth)
    await link.send(Auth(mac(b"a wrong secret of 16+ bytes", _UPSTREAM, hello, challenge.nonce)))
    answer = await link.receive()
    await link.aclose()
    return answer


async def test_a_pipeline_with_a_secret_is_bit_exact_and_refuses_strangers_mid_run(synth_model_path):
    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][3]
    prompts = _prompts(6, 260)
    with trio.fail_after(300):
        async with open_engine(path, n_ctx=N_CTX, n_batch=N_BATCH, threads=2, prefix_cache=False) as engine:
            solo = {kind: [await _generate(engine, p, s, 8) for p in prompts]
                    for kind, s in (("greedy", GREEDY), ("sampled", SAMPLED))}
        runtimes = [StageRuntime(path, layers, n_ctx=N_CTX, n_batch=N_BATCH, threads=1) for layers in splits[1:]]
        try:
            async with trio.open_nursery() as nursery:
                last = await nursery.start(lambda task_status: serve_stage(
                    runtimes[1], "127.0.0.1", 0, None, secret=SECRET, task_status=task_status))
                first = await nursery.start(lambda task_status: serve_stage(
                    runtimes[0], "127.0.0.1", 0, ("127.0.0.1", last), secret=SECRET, task_status=task_status))
                async with open_pipeline(path, splits[0][1], ("127.0.0.1", first), n_ctx=N_CTX, n_batch=N_BATCH,
                                         threads=1, secret=SECRET) as engine:
                    assert await _concurrently(engine, prompts, GREEDY, 8) == solo["greedy"]
                    for port, runtime, stage in ((first, runtimes[0], 0), (last, runtimes[1], 1)):
                        answer = await _stranger(port, runtime, stage)
                        assert isinstance(answer, Error) and answer.code == "unauthenticated"
                    # the session the strangers tried to displace serves on, on the same connection
                    epoch = engine.runtime.link.session.epoch
                    assert await _concurrently(engine, prompts, SAMPLED, 8) == solo["sampled"]
                    assert engine.runtime.link.session.epoch == epoch
                # a stage 0 without the secret, and one with another, open nothing
                for secret in (None, b"not the pipeline's secret!"):
                    with pytest.raises(StageUnavailableError, match="unauthenticated"):
                        async with open_pipeline(path, splits[0][1], ("127.0.0.1", first), n_ctx=N_CTX,
                                                 n_batch=N_BATCH, threads=1, secret=secret):
                            pass
                nursery.cancel_scope.cancel()
        finally:
            for rt in runtimes:
                rt.close()


async def test_stage_0_refuses_a_stage_without_the_secret(synth_model_path):
    path = synth_model_path("llama", deep=True)
    splits = PINNED_SPLITS["llama"][2]
    with trio.fail_after(120):
        runtime = StageRuntime(path, splits[1], n_ctx=N_CTX, n_batch=N_BATCH, threads=1)
        try:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_stage, runtime, "127.0.0.1", 0, None)  # no secret
                with pytest.raises(StageUnavailableError, match="did not authenticate"):
                    async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), n_ctx=N_CTX, n_batch=N_BATCH,
                                             threads=1, secret=SECRET):
                        pass
                nursery.cancel_scope.cancel()
        finally:
            runtime.close()
