"""The one OpenAI streaming client every engine is measured through.

httpx (on trio through anyio) with httpx-sse for the event-stream framing. One request is
POST /v1/completions with token-id prompt, `stream`, usage in the last chunk and
`ignore_eos` so output lengths are exact. Timestamps are taken as each SSE event is parsed;
what they mean is in records.RequestRecord. A failure (HTTP status, an error event in the
stream, a transport error, a short answer) is recorded, never raised, so one bad request
does not end a sweep.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from .records import RequestRecord


def completion_body(model: str, prompt: list[int], max_tokens: int, temperature: float, seed: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def _error_text(response: httpx.Response, body: bytes) -> str:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode(errors="replace")
    return f"HTTP {response.status_code}: {message}"


def _chunk_text(choice: dict[str, Any]) -> str:
    """A completion chunk's `text`, or a chat chunk's `delta.content`."""
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict[str, Any], *, index: int,
                            warmup: bool, t0: float, path: str = "/v1/completions",
                            texts: list[str] | None = None) -> RequestRecord:
    """Send one streamed completion (or, with `path` /v1/chat/completions, a chat completion); `t0`
    is the perf_counter origin of the run. `texts`, if given, collects each chunk's text (a
    multi-turn client sends the answer back as the next turn's history)."""
    sent = time.perf_counter()
    rec = RequestRecord(index=index, warmup=warmup, t_send=sent - t0)
    last_text: float | None = None
    chunks = 0
    try:
        async with aconnect_sse(client, "POST", f"{url}{path}", json=body) as source:
            response = source.response
            if response.status_code != 200:
                rec.error = _error_text(response, await response.aread())
                return rec
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                now = time.perf_counter()
                data = json.loads(event.data)
                if not isinstance(data, dict):
                    rec.error = f"unexpected event: {event.data[:100]}"
                    return rec
                if data.get("error"):
                    err = data["error"]
                    rec.error = f"stream error: {err.get('message', err) if isinstance(err, dict) else err}"
                    return rec
                choices = data.get("choices") or []
                if choices:
                    rec.e2e = now - sent
                    text = _chunk_text(choices[0])
                    if text:
                        if texts is not None:
                            texts.append(text)
                        chunks += 1
                        if last_text is None:
                            rec.ttft = now - sent
                        else:
                            rec.itl.append(now - last_text)
                        last_text = now
                usage = data.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = details.get("cached_tokens")
    except (httpx.HTTPError, ValueError, KeyError) as exc:  # transport, SSE framing, bad JSON
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    if not rec.output_tokens:  # no usage chunk: count what arrived
        rec.output_tokens = chunks
    if rec.ttft is None:
        rec.error = "no token arrived"
    elif rec.output_tokens != body["max_tokens"]:
        rec.error = f"{rec.output_tokens} tokens instead of {body['max_tokens']} (ignore_eos not honoured?)"
    return rec
