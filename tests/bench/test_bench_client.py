"""The streaming client's parsing and failure recording, against canned SSE over httpx's MockTransport."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from bench.gate.client import completion_body, stream_completion

pytestmark = pytest.mark.bench

SSE = {"content-type": "text/event-stream"}


def sse(*events) -> bytes:
    """Events as SSE frames; bytes go out as they are (comments, multi-line data)."""
    return b"".join(e if isinstance(e, bytes) else f"data: {e if isinstance(e, str) else json.dumps(e)}\r\n\r\n".encode()
                    for e in events)


def chunk(text: str, reason=None) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": reason}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                  "prompt_tokens_details": {"cached_tokens": 2}}}


async def run(handler, max_tokens: int = 3):
    seen = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return handler(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(recording)) as client:
        with trio.fail_after(10):
            rec = await stream_completion(client, "http://test", completion_body("m", [1, 2, 3, 4, 5], max_tokens, 0.0, 7),
                                          index=4, warmup=False, t0=0.0)
    return rec, seen


async def test_a_full_stream_is_timed_and_counted():
    rec, seen = await run(lambda r: httpx.Response(200, headers=SSE, content=sse(
        chunk(""), chunk("a"), b": a comment\n\n", b'data: {"choices": [{"index": 0,\ndata: "text": "b"}]}\n\n',
        chunk("c"), chunk("", "length"),
        USAGE, "[DONE]")))
    assert seen[0] == {"model": "m", "prompt": [1, 2, 3, 4, 5], "max_tokens": 3, "temperature": 0.0, "seed": 7,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert rec.ok and rec.index == 4 and not rec.warmup
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (5, 3, 2)
    assert len(rec.itl) == 2  # a -> b -> c; the empty first and last chunks carry no text
    assert 0 <= rec.ttft <= rec.e2e


async def test_without_usage_text_chunks_are_counted():
    rec, _ = await run(lambda r: httpx.Response(200, headers=SSE, content=sse(chunk("a"), chunk("b"), "[DONE]")), 2)
    assert rec.ok and rec.output_tokens == 2 and rec.prompt_tokens is None


@pytest.mark.parametrize(("response", "error"), [
    (httpx.Response(429, json={"error": {"message": "queue full"}}), "HTTP 429: queue full"),
    (httpx.Response(500, content=b"boom"), "HTTP 500: boom"),
    (httpx.Response(200, headers=SSE, content=sse(chunk("a"), {"error": {"message": "shutting down"}})),
     "stream error: shutting down"),
    (httpx.Response(200, headers=SSE, content=sse(chunk("a"), "[DONE]")), "1 tokens instead of 3"),
    (httpx.Response(200, headers=SSE, content=sse(chunk(""), "[DONE]")), "no token arrived"),
    (httpx.Response(200, headers=SSE, content=sse("{not json")), "JSONDecodeError"),
    (httpx.Response(200, headers=SSE, content=sse("[1, 2]")), "unexpected event"),
    (httpx.Response(200, headers={"content-type": "application/json"}, json={"x": 1}), "SSEError"),
])
async def test_failures_are_recorded_not_raised(response, error):
    rec, _ = await run(lambda r: response)
    assert not rec.ok and error in rec.error


async def test_transport_errors_are_recorded():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    rec, _ = await run(refuse)
    assert rec.error == "ConnectError: refused"


async def test_a_chat_stream_is_timed_from_its_first_content_and_its_text_collected():
    """The replica benchmark's multi-turn client: deltas, a role-only first chunk, the answer kept."""
    def delta(content=None, role=None) -> dict:
        d = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}

    paths, texts = [], []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, headers=SSE, content=sse(delta(role="assistant"), delta("Hel"), delta("lo"),
                                                              delta("!"), USAGE, "[DONE]"))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with trio.fail_after(10):
            rec = await stream_completion(client, "http://test", {"messages": [], "max_tokens": 3}, index=0,
                                          warmup=False, t0=0.0, path="/v1/chat/completions", texts=texts)
    assert paths == ["/v1/chat/completions"] and rec.ok and "".join(texts) == "Hello!"
    assert len(rec.itl) == 2 and rec.output_tokens == 3  # the role-only chunk is not the first token
