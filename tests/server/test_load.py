"""Backpressure and cancellation: a burst past the queue bound, a client that hangs up mid-stream."""

from __future__ import annotations

import json
from functools import partial
from contextlib import aclosing

import httpx
import openai
import pytest
import trio

from skippy.kv import ComponentKind

from ._live import in_thread, live_server, metric, openai_client

pytestmark = pytest.mark.server

M = "test-model"
ATTN = ComponentKind.ATTN


async def test_burst_past_the_queue_bound_gets_429s_and_every_request_an_answer(synth_model_path):
    n = 12
    statuses: list[int] = []
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama"), n_seq_max=1, max_waiting=2) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:

                async def one(i: int, stream: bool) -> None:
                    body = {"model": M, "prompt": f"request {i}", "max_tokens": 64, "ignore_eos": True,
                            "stream": stream}
                    async with http.stream("POST", "/v1/completions", json=body) as r:
                        raw = (await r.aread()).decode()
                    if r.status_code == 200 and stream:
                        events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
                        assert events[-1] == "[DONE]"
                        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
                    elif r.status_code == 200:
                        assert json.loads(raw)["usage"]["completion_tokens"] == 64  # ignore_eos: exact length
                    else:
                        assert r.status_code == 429, raw
                        assert r.headers["retry-after"] == "1"
                        assert json.loads(raw)["error"]["type"] == "rate_limit_error"
                    statuses.append(r.status_code)

                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, i, i % 2 == 0)
                text = (await http.get("/metrics")).text
            # the openai client surfaces a 429 as RateLimitError
            async with trio.open_nursery() as nursery:
                errors = []

                async def call():
                    try:
                        await in_thread(openai_client(url).completions.create, model=M, prompt="x", max_tokens=64,
                                        extra_body={"ignore_eos": True})
                    except openai.RateLimitError as exc:
                        errors.append(exc)
                for _ in range(6):
                    nursery.start_soon(call)
            stats = engine.stats()
    assert len(statuses) == n  # every request got an answer
    ok, limited = statuses.count(200), statuses.count(429)
    assert ok + limited == n and limited >= 1 and ok >= 3, statuses
    assert metric(text, "skippy_queue_rejections_total") == limited
    assert metric(text, "skippy_requests_finished_total", 'reason="length"') == ok
    assert metric(text, "skippy_time_to_first_token_seconds_count") == ok
    assert errors and stats.rejected == limited + len(errors)


async def test_client_disconnect_mid_stream_cancels_and_frees_cells(synth_model_path):
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama")) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                before = (await http.get("/metrics")).text
                assert metric(before, "skippy_kv_used_cells", 'component="attn"') == 0
                ledger = engine.runtime.ledger().get(ATTN)
                assert metric(before, "skippy_kv_bytes_per_cell", 'component="attn"') == ledger.bytes / ledger.size
                body = {"model": M, "prompt": "a long story", "max_tokens": 900, "ignore_eos": True, "stream": True}
                # the engine's step count when the hang-up reaches it as a cancel: how soon the HTTP side
                # notices depends on this box's load (several run-loop turns, and a tiny model's steps are
                # sub-millisecond), so the steps are counted from there
                # counted at the runtime: stats count a run's steps (scheduling.run_ahead) once it is collected
                steps_at_cancel: list[int] = []
                decodes = [0]
                cancel, decode_sample = engine._cancel, engine.runtime.decode_sample

                def counted_cancel(request) -> None:
                    steps_at_cancel.append(decodes[0])
                    cancel(request)

                def counted_decode(*args, **kwargs):
                    decodes[0] += 1
                    return decode_sample(*args, **kwargs)

                engine.runtime.decode_sample = counted_decode

                engine._cancel = counted_cancel
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    seen = 0
                    async with aclosing(r.aiter_lines()) as lines:
                        async for line in lines:
                            seen += line.startswith("data: ")
                            if seen == 5:
                                break
                    during = (await http.get("/metrics")).text
                # the response is closed here: the connection is gone mid-stream
                assert metric(during, "skippy_kv_used_cells", 'component="attn"') > 0
                while engine.stats().kv_used[ATTN]:
                    await trio.sleep(0.001)
                steps_to_free = decodes[0] - steps_at_cancel[0]  # idle now: no step runs after the free
                after = (await http.get("/metrics")).text
            assert metric(after, "skippy_kv_used_cells", 'component="attn"') == 0
            assert metric(after, "skippy_requests_finished_total", 'reason="cancelled"') == 1
            assert metric(after, "skippy_requests_running") == 0
            # the step in flight when the cancel arrives completes; the next one frees the cells
            assert len(steps_at_cancel) == 1 and steps_to_free <= 2, (steps_at_cancel, steps_to_free)
            assert metric(after, "skippy_generation_tokens_total") < 900
            assert engine.live == 0


async def test_client_that_hangs_up_on_a_non_streaming_request_cancels_it(synth_model_path):
    with trio.fail_after(30):
        async with live_server(synth_model_path("llama")) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                body = {"model": M, "prompt": "a long story", "max_tokens": 900, "ignore_eos": True}
                with trio.move_on_after(10) as waited:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(partial(http.post, "/v1/completions", json=body))
                        while engine.stats().output_tokens < 5:
                            await trio.sleep(0.005)
                        nursery.cancel_scope.cancel()  # the client gives up: its connection closes
                assert not waited.cancelled_caught
                while engine.stats().kv_used[ATTN]:
                    await trio.sleep(0.005)
                text = (await http.get("/metrics")).text
            assert metric(text, "skippy_requests_finished_total", 'reason="cancelled"') == 1
            assert engine.stats().output_tokens < 900
