"""The API as real clients use it, over HTTP on loopback with the real engine on a FakeRuntime
(scheduler and protocol plumbing, no llama claim): tolerant fields, prompt lists, llama-server's
aliases and routes, penalties and logit_bias, /v1/models, --api-key, --alias."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio

from skippy.server import create_app, serve_app
from skippy.testing import FakeRuntime, open_fake_engine

from .test_errors import assert_error_shape

pytestmark = pytest.mark.server

N_CTX = 512
P1, P2, P3 = [3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]


@asynccontextmanager
async def fake_server(**app_options):
    """(http client, fake runtime, app) for an app over a fake engine, served on an ephemeral port."""
    rt = FakeRuntime(n_ctx=N_CTX, n_batch=32, n_seq_max=8, n_vocab=64)
    async with open_fake_engine(rt) as engine:
        app = create_app(engine, model_names=["m", "alias"], **app_options)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve_app, app, "127.0.0.1", 0))
            async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:
                yield http, rt, app
            nursery.cancel_scope.cancel()


def text_of(rt: FakeRuntime, tokens) -> str:
    return "".join(rt.piece(t).decode() for t in tokens)


def sse_data(raw: str) -> list:
    events = [line[6:] for line in raw.split("\r\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", raw[-200:]
    return [json.loads(e) for e in events[:-1]]


async def test_unknown_fields_are_ignored_and_listed_known_ones_still_strict():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            body = {"model": "m", "prompt": P1, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                    "frobnicate": {"x": 1}, "guided_json": None, "cache_prompt": True, "user": "u"}
            r = await http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.headers["x-skippy-ignored-fields"] == "frobnicate, guided_json"
            assert r.json()["choices"][0]["text"] == text_of(rt, rt.solo(P1, 4))
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "max_tokens": 2})
            assert "x-skippy-ignored-fields" not in r.headers  # nothing ignored, no header
            async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200 and r.headers["x-skippy-ignored-fields"] == "frobnicate, guided_json"
                await r.aread()
            for bad, param in [({"temperature": "hot"}, "temperature"), ({"n": 0}, "n"), ({"echo": "yes"}, "echo"),
                               ({"logprobs": 21}, "logprobs"), ({"max_tokens": 0}, "max_tokens"), ({"seed": -5}, "seed"),
                               ({"stop": ["x"] * 65}, "stop"), ({"presence_penalty": 3}, "presence_penalty"),
                               ({"logit_bias": {"64": 1}}, "logit_bias"), ({"n_predict": "ten"}, "n_predict")]:
                r = await http.post("/v1/completions", json={**body, **bad})
                assert r.status_code == 400, (bad, r.text)
                assert_error_shape(r.json())
                assert r.json()["error"]["param"] == param


async def test_a_list_of_prompts_gets_one_choice_each_in_order():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            base = {"model": "m", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
            r = await http.post("/v1/completions", json={**base, "prompt": [P1, P2, P3]})
            assert r.status_code == 200, r.text
            full = r.json()
            assert [c["index"] for c in full["choices"]] == [0, 1, 2]
            assert [c["text"] for c in full["choices"]] == [text_of(rt, rt.solo(p, 6)) for p in (P1, P2, P3)]
            assert full["usage"]["prompt_tokens"] == len(P1) + len(P2) + len(P3)
            assert full["usage"]["completion_tokens"] == 18

            r = await http.post("/v1/completions", json={**base, "prompt": [P1, P2, P3], "stream": True,
                                                         "stream_options": {"include_usage": True}})
            chunks = sse_data(r.text)
            by_index: dict[int, list] = {0: [], 1: [], 2: []}
            for c in chunks[:-1]:
                (choice,) = c["choices"]
                by_index[choice["index"]].append(choice)
            assert ["".join(ch["text"] for ch in by_index[i]) for i in range(3)] == [c["text"] for c in full["choices"]]
            assert all(by_index[i][-1]["finish_reason"] == "length" for i in range(3))
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]

            texts = await http.post("/v1/completions", json={**base, "prompt": ["ab", "c"]})
            assert [c["text"] for c in texts.json()["choices"]] == [
                text_of(rt, rt.solo(rt.tokenize(s).tolist(), 6)) for s in ("ab", "c")]
            # one prompt of the list cannot run: the whole request is a 400, nothing keeps running
            r = await http.post("/v1/completions", json={**base, "prompt": [P1, [1, 99]]})
            assert r.status_code == 400
            assert_error_shape(r.json())


async def test_llama_server_names_seed_minus_one_and_penalties():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P2, "n_predict": 5, "seed": -1,
                                                        "ignore_eos": True, "repeat_penalty": 1.0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 5
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P2, "n_predict": -1, "temperature": 0,
                                                        "ignore_eos": True})
            assert r.json()["usage"]["completion_tokens"] == N_CTX - len(P2)  # no limit: the rest of the context
            # logit_bias: +100 on token 5 makes it every greedy pick
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P2, "max_tokens": 6, "temperature": 0,
                                                        "logit_bias": {"5": 100}})
            assert r.json()["choices"][0]["text"] == rt.piece(5).decode() * 6
            # presence penalty above the fake's one-hot height: greedy never repeats a token
            plain, penalised = [
                (await http.post("/v1/completions", json={"model": "m", "prompt": P3, "max_tokens": 40, "temperature": 0,
                                                          "ignore_eos": True, **extra})).json()["choices"][0]["text"]
                for extra in ({}, {"presence_penalty": 1.5})]
            assert plain == text_of(rt, rt.solo(P3, 40)) and plain != penalised


async def test_penalties_are_refused_where_the_sampler_cannot_see_the_logits():
    with trio.fail_after(20):
        async with fake_server() as (http, _, app):
            app.state.server.local_sampling = False  # as for a staged pipeline (its last stage samples remotely)
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "frequency_penalty": 0.5})
            assert r.status_code == 400 and r.json()["error"]["param"] == "frequency_penalty"
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "min_tokens": 2})
            assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"  # a mask on the logits
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "typical_p": 0.9})
            assert r.status_code == 400 and r.json()["error"]["param"] == "typical_p"  # not in the last stage's params
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "xtc_probability": 0.5})
            assert r.status_code == 400 and r.json()["error"]["param"] == "xtc_probability"
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "mirostat": 2})
            assert r.status_code == 400 and r.json()["error"]["param"] == "mirostat"
            r = await http.post("/v1/completions", json={"model": "m", "prompt": P1, "max_tokens": 2})
            assert r.status_code == 200


async def test_tokenize_detokenize_and_models():
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            r = await http.post("/tokenize", json={"content": "hello", "add_special": False})
            assert r.status_code == 200 and r.json() == {"tokens": rt.tokenize("hello").tolist()}
            ids = r.json()["tokens"]
            r = await http.post("/tokenize", json={"content": "hi", "with_pieces": True})
            assert r.json()["tokens"] == [{"id": t, "piece": rt.piece(t).decode()} for t in rt.tokenize("hi").tolist()]
            r = await http.post("/detokenize", json={"tokens": ids})
            assert r.status_code == 200 and r.json() == {"content": text_of(rt, ids)}
            assert (await http.post("/detokenize", json={"tokens": []})).json() == {"content": ""}
            for path, body, param in [("/tokenize", {"content": 5}, "content"), ("/tokenize", {}, "content"),
                                      ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
                                      ("/detokenize", {"tokens": [1, 64]}, "tokens"),
                                      ("/detokenize", {"tokens": "1 2"}, "tokens")]:
                r = await http.post(path, json=body)
                assert r.status_code == 400, (path, body, r.text)
                assert_error_shape(r.json())
                assert r.json()["error"]["param"] == param
            assert (await http.post("/tokenize", content=b"{nope")).status_code == 400

            models = (await http.get("/v1/models")).json()["data"]
            assert [m["id"] for m in models] == ["m", "alias"]
            assert all(m["max_model_len"] == N_CTX and m["meta"]["n_ctx"] == N_CTX and m["meta"]["n_vocab"] == 64
                       for m in models)
            r = await http.post("/v1/completions", json={"model": "alias", "prompt": P1, "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == "alias"


async def test_api_key_guards_everything_but_health_and_metrics():
    with trio.fail_after(20):
        async with fake_server(api_keys=["sekrit", "other"]) as (http, _, _):
            completion = {"model": "m", "prompt": P1, "max_tokens": 2, "ignore_eos": True}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"},
                            {"Authorization": "Basic sekrit"}):
                for method, path, body in [("POST", "/v1/completions", completion), ("GET", "/v1/models", None),
                                           ("POST", "/tokenize", {"content": "x"}), ("GET", "/v1/nothing", None)]:
                    r = await http.request(method, path, json=body, headers=headers)
                    assert r.status_code == 401, (headers, path, r.text)
                    assert_error_shape(r.json())
                    assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/metrics")).status_code == 200
            for key in ("sekrit", "other"):
                ok = {"Authorization": f"Bearer {key}"}
                r = await http.post("/v1/completions", json=completion, headers=ok)
                assert r.status_code == 200, r.text
                async with http.stream("POST", "/v1/completions", json={**completion, "stream": True}, headers=ok) as r:
                    assert r.status_code == 200
                    assert sse_data((await r.aread()).decode())[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_cancels_every_prompt_of_its_request(stream):
    import time

    with trio.fail_after(30):
        async with fake_server() as (http, rt, app):
            rt.on_decode = lambda: time.sleep(0.005)  # slow steps: the client leaves long before the end
            engine = app.state.server.engine
            body = {"model": "m", "prompt": [P1, P2, P3], "max_tokens": 400, "ignore_eos": True, "stream": stream}
            if stream:
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_bytes():
                        break  # the first chunk came: leave
            else:
                with trio.move_on_after(0.3):
                    await http.post("/v1/completions", json=body)
            while engine.stats().finished["cancelled"] < 3:
                await trio.sleep(0.01)
            await engine.settled()
            assert engine.stats().finished["length"] == 0 and not app.state.server.in_flight


async def test_vllms_min_tokens_stop_token_ids_include_stop_str_in_output_and_typical_p():
    """The fields vLLM's clients and load generators send (one of them sends min_tokens on every request)."""
    with trio.fail_after(20):
        async with fake_server() as (http, rt, _):
            solo = rt.solo(P1, 8)
            body = {"model": "m", "prompt": P1, "max_tokens": 8, "temperature": 0}
            r = await http.post("/v1/completions", json={**body, "min_tokens": 8, "stop_token_ids": [solo[3]]})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            # the stop id cannot be picked before 8 tokens: the fake's next best instead, to the length
            assert choice["text"].startswith(text_of(rt, solo[:3])) and len(choice["text"]) == 8
            assert choice["text"][3] != text_of(rt, solo[3:4]) and choice["finish_reason"] == "length"
            r = await http.post("/v1/completions", json={**body, "stop_token_ids": [solo[3]]})
            assert r.json()["choices"][0]["text"] == text_of(rt, solo[:3])
            stop = text_of(rt, solo[2:4])
            r = await http.post("/v1/completions", json={**body, "stop": [stop], "include_stop_str_in_output": True})
            assert r.json()["choices"][0]["text"] == text_of(rt, solo[:4]) and "x-skippy-ignored-fields" not in r.headers
            for extra in ({"typical_p": 0.5}, {"xtc_probability": 0.5, "xtc_threshold": 0.2},
                          {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
                          {"mirostat": 1, "mirostat_tau": 3.0}, {"dry_multiplier": 0.8, "dry_sequence_breakers": ["ab", "c"]},
                          {"dry_multiplier": 0.8, "dry_base": 0.5, "dry_allowed_length": 1,
                           "dry_penalty_last_n": -1}):
                r = await http.post("/v1/completions", json={**body, "temperature": 1.0, "seed": 3, **extra})
                assert r.status_code == 200 and "x-skippy-ignored-fields" not in r.headers
            for bad, param in [({"min_tokens": 9}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
                               ({"typical_p": 0}, "typical_p"), ({"typical_p": 1.5}, "typical_p"),
                               ({"xtc_probability": 2}, "xtc_probability"), ({"xtc_threshold": "x"}, "xtc_threshold"),
                               ({"mirostat": 3}, "mirostat"), ({"dry_multiplier": -1}, "dry_multiplier"),
                               ({"dry_multiplier": 1, "dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
                               ({"dry_multiplier": 1, "dry_sequence_breakers": [1]}, "dry_sequence_breakers"),
                               ({"dry_multiplier": 1, "dry_sequence_breakers": []}, "dry_sequence_breakers"),
                               ({"dry_allowed_length": -1}, "dry_allowed_length"),
                               ({"mirostat_tau": -1}, "mirostat_tau"),
                               ({"stop_token_ids": [64]}, "stop_token_ids"), ({"stop_token_ids": "7"}, "stop_token_ids"),
                               ({"include_stop_str_in_output": 1}, "include_stop_str_in_output")]:
                r = await http.post("/v1/completions", json={**body, **bad})
                assert r.status_code == 400, (bad, r.text)
                assert_error_shape(r.json())
                assert r.json()["error"]["param"] == param


def test_a_pipeline_engine_is_known_not_to_sample_beside_its_logits():
    from skippy.server.app import _samples_locally
    from skippy.staged._pipeline import PipelineRuntime

    class Engine:
        def __init__(self, runtime):
            self.runtime = runtime

    assert not _samples_locally(Engine(object.__new__(PipelineRuntime)))
    assert _samples_locally(Engine(FakeRuntime()))
