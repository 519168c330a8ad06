"""logprobs, echo and n > 1 over HTTP with the real engine on a FakeRuntime: the response shapes, streamed
and not, and the scheduling behind them (no llama claim: see test_api_native.py for those)."""

from __future__ import annotations

import pytest
import trio

from .test_api_fields import P1, fake_server, sse_data, text_of

pytestmark = pytest.mark.server

BODY = {"model": "m", "prompt": P1, "max_tokens": 5, "temperature": 0}


async def test_completion_logprobs_shape_and_offsets():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            r = await http.post("/v1/completions", json={**BODY, "logprobs": 2})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            lp = choice["logprobs"]
            toks = rt.solo(P1, 5)
            assert choice["text"] == text_of(rt, toks)
            assert lp["tokens"] == [rt.piece(t).decode() for t in toks]
            assert all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"])
            assert [len(d) for d in lp["top_logprobs"]] == [2] * 5  # the chosen one is among the top 2 (greedy)
            assert lp["text_offset"] == [0, 1, 2, 3, 4]
            for d, t, v in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"]):
                assert d[t] == v and max(d.values()) == v
            plain = (await http.post("/v1/completions", json=BODY)).json()["choices"][0]
            assert plain["logprobs"] is None and plain["text"] == choice["text"]


async def test_echo_scores_the_prompt_and_max_tokens_zero_generates_nothing():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            r = await http.post("/v1/completions", json={**BODY, "echo": True, "logprobs": 1, "max_tokens": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            choice = body["choices"][0]
            assert choice["text"] == text_of(rt, P1) and choice["finish_reason"] == "length"
            lp = choice["logprobs"]
            assert lp["tokens"] == [rt.piece(t).decode() for t in P1]
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            assert all(isinstance(v, float) for v in lp["token_logprobs"][1:])
            assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(P1)
            # echo with generation: the prompt, then the completion; offsets run on through both
            r = await http.post("/v1/completions", json={**BODY, "echo": True, "logprobs": 0, "max_tokens": 3})
            choice = r.json()["choices"][0]
            assert choice["text"] == text_of(rt, P1) + text_of(rt, rt.solo(P1, 3))
            assert choice["logprobs"]["text_offset"] == list(range(len(P1) + 3))
            assert len(choice["logprobs"]["token_logprobs"]) == len(P1) + 3
            # echo alone: the text only
            r = await http.post("/v1/completions", json={**BODY, "echo": True, "max_tokens": 0})
            assert r.json()["choices"][0] == {"index": 0, "text": text_of(rt, P1), "logprobs": None,
                                              "finish_reason": "length"}


async def test_streamed_logprobs_and_echo_equal_the_whole_response():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            body = {**BODY, "echo": True, "logprobs": 2, "max_tokens": 4}
            whole = (await http.post("/v1/completions", json=body)).json()["choices"][0]
            r = await http.post("/v1/completions", json={**body, "stream": True})
            chunks = sse_data(r.text)
            text = "".join(c["choices"][0]["text"] for c in chunks)
            merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            for c in chunks:
                lp = c["choices"][0]["logprobs"]
                for k in merged:
                    merged[k] += lp[k] if lp else []
            assert text == whole["text"] and merged == whole["logprobs"]
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_n_choices_equal_single_requests_with_seed_plus_index():
    body = {"model": "m", "prompt": P1, "max_tokens": 6, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    with trio.fail_after(30):
        async with fake_server() as (http, rt, app):
            r = await http.post("/v1/completions", json={**body, "n": 3})
            assert r.status_code == 200, r.text
            got = r.json()
            assert [c["index"] for c in got["choices"]] == [0, 1, 2]
            singles = [(await http.post("/v1/completions", json={**body, "seed": 5 + i})).json()["choices"][0]["text"]
                       for i in range(3)]
            assert [c["text"] for c in got["choices"]] == singles
            assert len(set(singles)) > 1  # seeded differently, not the same sample thrice
            assert got["usage"]["prompt_tokens"] == len(P1) and got["usage"]["completion_tokens"] == 18
            assert app.state.server.engine.stats().fork_shared_tokens == 2 * (len(P1) - 1)
            metrics = (await http.get("/metrics")).text
            assert f"skippy_fork_shared_tokens_total {2.0 * (len(P1) - 1)}" in metrics
            # streamed: choices interleave, each with its index; each one's text is the same
            r = await http.post("/v1/completions", json={**body, "n": 3, "stream": True})
            texts = ["", "", ""]
            for c in sse_data(r.text):
                for ch in c["choices"]:
                    texts[ch["index"]] += ch["text"]
            assert texts == singles


async def test_n_times_prompts_index_in_prompt_major_order():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            r = await http.post("/v1/completions", json={"model": "m", "prompt": [P1, [9, 2, 6]], "n": 2,
                                                         "max_tokens": 3, "temperature": 0})
            choices = r.json()["choices"]
            assert [c["index"] for c in choices] == [0, 1, 2, 3]
            assert [c["text"] for c in choices] == [text_of(rt, rt.solo(P1, 3))] * 2 + [text_of(rt, rt.solo([9, 2, 6], 3))] * 2
            assert r.json()["usage"]["prompt_tokens"] == len(P1) + 3
