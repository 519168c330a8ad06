"""The two smallest shapes every response route writes: one server-sent event's bytes and the
usage object. Pure, like protocol.

Apart from protocol because the tool-call stream (structured.tool_sse) writes them too, and
protocol imports structured to read a request's structured-output fields: each importing the
other was a circle.
"""

from __future__ import annotations

import json
from typing import Any


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def sse_event(obj: Any) -> bytes:
    """One server-sent event whose data is `obj` as JSON (or a literal string such as [DONE])."""
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return b"data: " + data.encode() + b"\r\n\r\n"
