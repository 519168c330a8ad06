"""Every error case: status, OpenAI's error body, and never a 500 for bad input."""

from __future__ import annotations

import httpx
import openai
import pytest
import trio

from ._live import in_thread, live_server, openai_client

pytestmark = pytest.mark.server

M = "test-model"
OK = {"model": M, "prompt": "hello", "max_tokens": 2}
CHAT = {"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

BAD = [  # (path, body, status, param or None)
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", {**OK, "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**OK, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {**OK, "temperature": 3}, 400, "temperature"),
    ("/v1/completions", {**OK, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {**OK, "top_k": 1.5}, 400, "top_k"),
    ("/v1/completions", {**OK, "seed": "x"}, 400, "seed"),
    ("/v1/completions", {**OK, "seed": -2}, 400, "seed"),  # -1: no seed
    ("/v1/completions", b'{"model": "test-model", "prompt": "x", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", b'{"model": "test-model", "prompt": "\xff\xfe"}', 400, None),
    ("/v1/completions", "\xff".encode("latin-1"), 400, None),
    ("/v1/completions", {**OK, "stop": 3}, 400, "stop"),
    ("/v1/completions", {**OK, "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {**OK, "ignore_eos": 1}, 400, "ignore_eos"),
    ("/v1/completions", {**OK, "priority": "high"}, 400, "priority"),
    ("/v1/completions", {**OK, "n": 0}, 400, "n"),
    ("/v1/completions", {**OK, "n": 129}, 400, "n"),
    ("/v1/completions", {**OK, "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {**OK, "echo": 1}, 400, "echo"),
    ("/v1/completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),  # 0 only with echo
    ("/v1/completions", {**OK, "frequency_penalty": 2.5}, 400, "frequency_penalty"),
    ("/v1/completions", {**OK, "logit_bias": {"999999": 1}}, 400, "logit_bias"),
    ("/v1/completions", {**OK, "stop": ["x"] * 65}, 400, "stop"),
    ("/v1/completions", {**OK, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {**OK, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": ["a", ""]}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": ["a", [1]]}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": [1, -2]}, 400, None),
    ("/v1/completions", {**OK, "prompt": [1, 10**9]}, 400, None),
    ("/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("/v1/completions", {**OK, "max_tokens": 5000}, 400, "prompt"),  # prompt + max_tokens > n_ctx
    ("/v1/completions", {**OK, "prompt": "word " * 2000}, 400, "prompt"),
    ("/v1/completions", {**OK, "model": "gpt-nope"}, 404, "model"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"content": "hi"}]}, 400, "messages[0]"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 3}, 400, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, 400, "top_logprobs"),  # needs logprobs: true
    ("/v1/chat/completions", {**CHAT, "echo": True}, 400, "echo"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 4000}, 400, "prompt"),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-nope"}, 404, "model"),
]


def assert_error_shape(body: dict) -> None:
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def test_bad_input_gets_4xx_with_openai_error_body(synth_model_path):
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama")) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=20) as http:
                for path, body, status, param in BAD:
                    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
                    r = await http.post(path, headers={"content-type": "application/json"}, **kw)
                    assert r.status_code == status, (body, r.text)
                    assert_error_shape(r.json())
                    if param is not None:
                        assert r.json()["error"]["param"] == param, (body, r.text)
                for path, method in [("/v1/nothing", "GET"), ("/v1/completions", "GET"), ("/metrics", "POST")]:
                    r = await http.request(method, path)
                    assert r.status_code in (404, 405)
                    assert_error_shape(r.json())
                # the server is still healthy and serving after all of that
                r = await http.post("/v1/completions", json=OK)
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
                assert (await http.get("/health")).json()["status"] == "ok"
            assert engine.stats().finished["error"] == 0


async def test_openai_client_raises_its_named_errors(synth_model_path):
    with trio.fail_after(30):
        async with live_server(synth_model_path("llama")) as (url, _, _):
            client = openai_client(url)
            with pytest.raises(openai.NotFoundError) as nf:
                await in_thread(client.completions.create, model="gpt-nope", prompt="hi", max_tokens=2)
            assert nf.value.body["code"] == "model_not_found"
            with pytest.raises(openai.BadRequestError) as br:
                await in_thread(client.completions.create, model=M, prompt="hi", max_tokens=2, n=0)
            assert br.value.body["param"] == "n"
            with pytest.raises(openai.BadRequestError) as br:
                await in_thread(client.chat.completions.create, model=M, max_tokens=4000,
                                messages=[{"role": "user", "content": "hi"}])
            assert br.value.body["code"] == "context_length_exceeded"
