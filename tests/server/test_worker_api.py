"""The endpoints a router asks of its workers (server.worker_api), checked against the shapes
sglang-router 0.3.2 parses (see that module's docstring for the source files)."""

from __future__ import annotations

from contextlib import aclosing

import httpx
import pytest
import trio

from ._live import live_server

pytestmark = pytest.mark.server

M = "test-model"
# sgl-model-gateway/src/core/steps/worker/local/discover_metadata.rs, `ServerInfo`: every field Option<>,
# so a present one must have this JSON type or serde fails the whole parse (and the worker is "unknown")
SERVER_INFO = {"model_id": str, "model_path": str, "served_model_name": str, "dp_size": int, "version": str,
               "max_batch_size": int, "max_total_tokens": int, "max_prefill_tokens": int,
               "max_running_requests": int, "max_num_reqs": int}
LONG = {"model": M, "prompt": "a b c", "max_tokens": 3500, "ignore_eos": True, "stream": True}  # runs for a while
MODEL_INFO = {"model_path": str, "tokenizer_path": str, "is_generation": bool, "model_type": str}  # `ModelInfo`


def _typed(body: dict, schema: dict) -> None:
    for key, kind in schema.items():
        assert isinstance(body[key], kind) and not (kind is int and isinstance(body[key], bool)), (key, body[key])


async def test_server_and_model_info_have_the_fields_the_router_parses(synth_model_path):
    with trio.fail_after(30):
        async with live_server(synth_model_path("llama"), names=[M, "alias"]) as (url, app, engine):
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                for path in ("/server_info", "/get_server_info"):
                    info = (await http.get(path)).json()
                    _typed(info, SERVER_INFO)
                    # the router's model id: served_model_name (create_worker.rs), the name clients send
                    assert info["served_model_name"] == info["model_id"] == M and info["aliases"] == [M, "alias"]
                    assert info["model_path"].endswith(".gguf") and info["dp_size"] == 1
                    assert info["n_ctx"] == info["max_total_num_tokens"] == engine.n_ctx
                    assert info["ceiling"] == engine.lanes.ceiling and info["n_batch"] == engine.runtime.n_batch
                for path in ("/model_info", "/get_model_info"):
                    mi = (await http.get(path)).json()
                    _typed(mi, MODEL_INFO)
                    assert mi["model_type"] == "llama" and mi["is_generation"] is True


async def first_data(lines) -> None:
    """Read up to the first SSE data line. The caller holds `lines` open for the block: an iterator dropped
    mid-stream (`async for line in r.aiter_lines(): ... break`) is finalized at once, and its finalizer
    closes the connection (httpcore closes on any BaseException, GeneratorExit too), so the server
    cancels the request a moment later. That, not the scheduler, was /get_load's num_reqs 0 here."""
    async for line in lines:
        if line.startswith("data: "):
            return


async def test_get_load_is_the_array_the_router_sums_num_tokens_of(synth_model_path):
    """worker_manager.rs `get_worker_load`: an array; each entry's num_tokens an integer."""
    with trio.fail_after(30):
        async with live_server(synth_model_path("llama"), n_seq_max=4, n_ctx=4096) as (url, app, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                idle = (await http.get("/get_load")).json()
                assert isinstance(idle, list) and len(idle) == 1
                assert idle[0]["num_tokens"] == 0 and idle[0]["num_reqs"] == 0 and idle[0]["dp_rank"] == 0
                assert set(idle[0]["kv"]) == {"attn"} and idle[0]["kv"]["attn"]["free"] > 0
                async with http.stream("POST", "/v1/completions", json=LONG) as r, aclosing(r.aiter_lines()) as lines:
                    await first_data(lines)
                    assert (await http.get("/load")).json() == {"server_load": 1}
                    busy = (await http.get("/get_load")).json()[0]
                    assert busy["num_reqs"] == busy["num_running_reqs"] == 1 and busy["num_tokens"] > 0
                    assert isinstance(busy["num_tokens"], int) and 0 < busy["kv"]["attn"]["usage"] <= 1


async def test_flush_cache_drops_prefixes_and_is_refused_with_a_json_400_while_requests_run(synth_model_path):
    with trio.fail_after(30):
        async with live_server(synth_model_path("llama"), n_seq_max=4, n_ctx=4096) as (url, app, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                prompt = "the same long system prompt, again and again, " * 6
                r = await http.post("/v1/completions", json={"model": M, "prompt": prompt, "max_tokens": 2})
                assert r.status_code == 200
                await engine.settled()
                hit = await http.post("/v1/completions", json={"model": M, "prompt": prompt, "max_tokens": 2})
                assert hit.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # resident before the flush
                await engine.settled()
                assert engine.stats().prefix_entries >= 1
                async with http.stream("POST", "/v1/completions", json=LONG) as r, aclosing(r.aiter_lines()) as lines:
                    await first_data(lines)
                    refused = await http.post("/flush_cache")
                    assert refused.status_code == 400 and refused.json()["error"]["code"] == "requests_running"
                await engine.settled()
                ok = await http.post("/flush_cache")
                assert ok.status_code == 200 and ok.json()["entries_dropped"] >= 1
                assert engine.stats().prefix_entries == 0
                assert (await http.get("/flush_cache")).status_code == 200  # SGLang takes GET and POST
                again = await http.post("/v1/completions", json={"model": M, "prompt": prompt, "max_tokens": 2})
                assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # computed whole again
