"""Latency targets through the server: the targets in /metrics, met requests counted there, and a request
shed as late (`shed_late`) answered 429 + Retry-After with OpenAI's error body, streamed or not (a
streamed response starts only once the first event is in), never a 500 and never a hang."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from ._live import live_server, metric

pytestmark = pytest.mark.server

OK = {"model": "test-model", "prompt": "hello there", "max_tokens": 4}
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


async def test_targets_and_outcomes_are_in_metrics(synth_model_path):
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama"), ttft_slo_ms=60_000, tpot_slo_ms=10_000) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for _ in range(3):
                    assert (await http.post("/v1/completions", json=OK)).status_code == 200
                await engine.settled()
                text = (await http.get("/metrics")).text
    assert metric(text, "skippy_slo_tpot_target_seconds") == 10.0
    assert metric(text, "skippy_slo_ttft_target_seconds") == 60.0
    assert metric(text, "skippy_slo_requests_total", 'outcome="met"') == 3
    assert metric(text, "skippy_slo_requests_total", 'outcome="shed"') == 0


async def test_derived_targets_show_in_metrics(synth_model_path):
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama")) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                text = (await http.get("/metrics")).text
            said = engine.latency_targets()
    assert "derived" in said and "TPOT" in said and "TTFT" in said  # what `skippy serve` prints at start
    assert "advisory" in said  # none configured: they shape steps and hold nobody back (scheduling.slo)
    # the probe at open measured this machine: a one-row step's 5x, and a 128-token prompt's 10x
    assert 0 < metric(text, "skippy_slo_tpot_target_seconds") < 10
    assert 0 < metric(text, "skippy_slo_ttft_target_seconds") < 60


async def test_a_request_that_cannot_meet_its_ttft_is_shed_with_429(synth_model_path):
    """A TTFT target no prompt can meet (1 us): with shed_late every request is refused at once."""
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama"), ttft_slo_ms=0.001, tpot_slo_ms=1000,
                               shed_late=True) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                r = await http.post("/v1/completions", json=OK)
                assert r.status_code == 429, r.text
                assert int(r.headers["retry-after"]) >= 1
                err = r.json()["error"]
                assert err["type"] == "rate_limit_error" and err["code"] == "late_shed"
                for path, body in (("/v1/completions", OK), ("/v1/chat/completions", CHAT)):
                    async with http.stream("POST", path, json={**body, "stream": True}) as s:
                        assert s.status_code == 429  # before the stream starts: a status, not an error event
                        assert int(s.headers["retry-after"]) >= 1
                        err = json.loads(await s.aread())["error"]
                    assert err["code"] == "late_shed"
                text = (await http.get("/metrics")).text
                assert metric(text, "skippy_slo_requests_total", 'outcome="shed"') == 3
                assert (await http.get("/health")).status_code == 200
            assert engine.stats().finished["error"] == 0  # shed requests are refusals, not failures


async def test_with_shed_late_a_stream_that_makes_its_targets_streams_as_before(synth_model_path):
    """The first event read ahead (to answer a refusal as a status) is the first the client gets: every
    token once, in order, for one choice and for two."""
    with trio.fail_after(60):
        async with live_server(synth_model_path("llama"), ttft_slo_ms=60_000, tpot_slo_ms=10_000,
                               shed_late=True) as (url, _, engine):
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                greedy = {**OK, "temperature": 0}
                whole = (await http.post("/v1/completions", json={**greedy, "n": 2})).json()
                for n in (1, 2):
                    async with http.stream("POST", "/v1/completions", json={**greedy, "stream": True, "n": n}) as s:
                        assert s.status_code == 200
                        lines = [line async for line in s.aiter_lines() if line.startswith("data: ")]
                    assert lines[-1] == "data: [DONE]"
                    chunks = [json.loads(line[6:])["choices"] for line in lines[:-1]]
                    texts = ["".join(c["text"] for cs in chunks for c in cs if c["index"] == i) for i in range(n)]
                    assert texts == [c["text"] for c in whole["choices"][:n]]  # greedy: the same text
                await engine.settled()
            assert engine.stats().running == 0
