"""The API as real clients use it, on the real library: prompt lists through the official client,
/tokenize against what a completion counts, penalties on real logits (seeded, whatever shares the
batch), and `skippy serve --alias --api-key` end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest
import trio

from ._live import in_thread, live_server, openai_client

pytestmark = pytest.mark.server

MODEL = "test-model"
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


async def test_prompt_lists_and_unknown_fields_through_the_openai_client(smollm2):
    with trio.fail_after(90):
        async with live_server(smollm2) as (url, _, _):
            client = openai_client(url)
            singles = [(await in_thread(client.completions.create, model=MODEL, prompt=p, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})).choices[0].text for p in PROMPTS]
            both = await in_thread(client.completions.create, model=MODEL, prompt=PROMPTS, max_tokens=8, temperature=0,
                                   extra_body={"ignore_eos": True, "cache_prompt": True, "guided_regex": None,
                                               "frobnicate": 1})
            assert [c.index for c in both.choices] == [0, 1, 2]
            assert [c.text for c in both.choices] == singles  # batch-invariant: the same greedy text
            assert both.usage.completion_tokens == 24

            def streamed():
                return list(client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=8, temperature=0,
                                                      stream=True, extra_body={"ignore_eos": True}))
            texts = ["", "", ""]
            for chunk in await in_thread(streamed):
                for c in chunk.choices:
                    texts[c.index] += c.text
            assert texts == singles
            with pytest.raises(openai.BadRequestError) as err:  # still strict where it knows the field
                await in_thread(client.completions.create, model=MODEL, prompt="x", max_tokens=2, presence_penalty=9)
            assert err.value.body["param"] == "presence_penalty"


async def test_tokenize_matches_what_a_completion_counts_and_detokenize_inverts_it(smollm2):
    text = "Skippy serves many sessions — through one context."
    with trio.fail_after(60):
        async with live_server(smollm2) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                with_special = (await http.post("/tokenize", json={"content": text, "add_special": True})).json()["tokens"]
                plain = (await http.post("/tokenize", json={"content": text})).json()["tokens"]
                r = await http.post("/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 1})
                assert r.json()["usage"]["prompt_tokens"] == len(with_special)
                assert with_special == engine.tokenize(text, True).tolist() and plain == engine.tokenize(text, False).tolist()
                assert (await http.post("/detokenize", json={"tokens": plain})).json() == {"content": text}
                pieces = (await http.post("/tokenize", json={"content": text, "with_pieces": True})).json()["tokens"]
                assert [p["id"] for p in pieces] == plain
                joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
                assert joined.decode() == text  # a piece that is not UTF-8 alone comes as its bytes
                models = (await http.get("/v1/models")).json()["data"]
                assert models[0]["max_model_len"] == engine.n_ctx and models[0]["meta"]["n_ctx_train"] == 8192


@pytest.mark.parametrize("prompt, penal", [
    ("Once upon a time", {"frequency_penalty": 1.2, "presence_penalty": 0.6, "repeat_penalty": 1.3,
                          "logit_bias": {"28": -5}}),
    ("one two three, one two three, one two three, one two", {"dry_multiplier": 0.8, "dry_allowed_length": 1}),
    ("Once upon a time", {"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.2}),
], ids=["penalties", "dry", "mirostat-v1"])
async def test_penalties_on_real_logits_are_seeded_whatever_shares_the_batch(smollm2, prompt, penal):
    with trio.fail_after(120):
        async with live_server(smollm2) as (url, _, _):
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                async def complete(extra):
                    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 24,
                                                                "temperature": 0.9, "seed": 11, "ignore_eos": True,
                                                                **extra})
                    assert r.status_code == 200, r.text
                    return r.json()["choices"][0]["text"]

                alone = await complete(penal)
                plain = await complete({})
                crowd: list[str] = [""] * 4
                async with trio.open_nursery() as nursery:
                    for i, extra in enumerate([penal, {"seed": 3}, {"presence_penalty": 2.0}, {"temperature": 0}]):
                        async def one(i=i, extra=extra):
                            crowd[i] = await complete(extra)
                        nursery.start_soon(one)
    assert crowd[0] == alone  # the same seed and penalties: the same tokens, with three others in the batch
    assert alone != plain  # and the penalties changed the draw


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_skippy_serve_alias_and_api_key(synth_model_path):
    synth_model_path("llama")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippy", "serve", "--family", "llama", "--port", str(port), "--threads", "1",
         "--n-ctx", "512", "--alias", "house-model", "--alias", "gpt-4o-mini", "--api-key", "k1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "SKIPPY_API_KEY": "ignored"})
    try:
        with trio.fail_after(45):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                while True:
                    try:
                        if (await http.get("/health")).status_code == 200:  # open without a key
                            break
                    except httpx.TransportError:
                        await trio.sleep(0.1)
                assert (await http.get("/v1/models")).status_code == 401
                auth = {"Authorization": "Bearer k1"}
                ids = [m["id"] for m in (await http.get("/v1/models", headers=auth)).json()["data"]]
                assert ids == ["llama-s0-v1", "llama", "house-model", "gpt-4o-mini"]
                body = {"model": "gpt-4o-mini", "prompt": "hi", "max_tokens": 3}
                assert (await http.post("/v1/completions", json=body)).status_code == 401
                r = await http.post("/v1/completions", json=body, headers=auth)
                assert r.status_code == 200 and r.json()["model"] == "gpt-4o-mini"
                r = await http.post("/v1/completions", json=body, headers={"Authorization": "Bearer ignored"})
                assert r.status_code == 401  # --api-key wins over $SKIPPY_API_KEY
            proc.send_signal(signal.SIGINT)
            rc = await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
        assert rc == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
