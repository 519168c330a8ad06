"""A slow reader gets every token once and in order, in fewer writes (GenerationStream.batch and
the SSE generator), over the real engine on a FakeRuntime: scheduler plumbing, no llama claim."""

from __future__ import annotations

import json
import time

import pytest
import trio

from skippy.server import create_app
from skippy.server import protocol as P
from skippy.server.app import _sse
from skippy.testing import FakeRuntime, open_fake_engine

pytestmark = pytest.mark.server

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


async def test_a_reader_that_fell_behind_gets_the_queued_events_in_one_batch():
    rt = FakeRuntime(n_ctx=512, n_batch=32, n_seq_max=4, n_vocab=64)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            stream = engine.generate(PROMPT, max_tokens=40, ignore_eos=True)
            while engine.stats().finished["length"] == 0:  # the reader does not read meanwhile
                await trio.sleep(0.01)
            events = await stream.batch()
            assert [e.index for e in events if e.token is not None] == list(range(40))
            assert events[-1].final and sum(e.final for e in events) == 1
            assert [e.token for e in events if e.token is not None] == rt.solo(PROMPT, 40)
            assert await stream.batch() == []  # ended: nothing more, no hang
            assert all(0 < e.t_sampled <= time.perf_counter() for e in events if e.token is not None)


async def test_the_sse_stream_of_a_slow_client_carries_every_token_once_in_order_in_fewer_writes():
    rt = FakeRuntime(n_ctx=512, n_batch=32, n_seq_max=4, n_vocab=64)
    with trio.fail_after(20):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            app = create_app(engine, model_names=["m"])
            state = app.state.server
            call = P.parse_completion({"model": "m", "prompt": PROMPT, "max_tokens": 60, "stream": True, "temperature": 0,
                                       "ignore_eos": True, "stream_options": {"include_usage": True}})
            stream = engine.generate(call.prompt, **call.engine_kwargs(60))
            state.track(stream)
            await stream.queued()
            writes = []
            async for chunk in _sse(state, stream, P.ResponseShape("completion", "cmpl-1", "m"), call, 0.0):
                writes.append(chunk)
                await trio.sleep(0.02)  # a slow client: the engine runs ahead meanwhile
    events = [line[6:] for w in writes for line in w.decode().split("\r\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == "".join(rt.piece(t).decode() for t in rt.solo(PROMPT, 60))  # every token, once, in order
    assert chunks[-1]["usage"]["completion_tokens"] == 60
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert len(writes) < 30  # coalesced: far fewer writes than tokens
    assert state.metrics.delivery._sum.get() > 0  # sampling -> bytes written was observed
