"""What each request of a stress run ended as: plain data the drivers fill and the checks read."""

from __future__ import annotations

from typing import Any

import attrs

# How a request ended, as its client saw it.
COMPLETED = "completed"  # a final event / response with finish_reason stop or length
CLIENT_CANCELLED = "client_cancelled"  # the client cancelled, closed or dropped it before the end
TIMED_OUT = "timed_out"  # the client's deadline passed first
REJECTED = "rejected"  # malformed: a named InvalidInputError / a 4xx with a JSON error body
OVERLOADED = "overloaded"  # OverloadedError / 429 with Retry-After: a clear, retryable refusal
FAILED = "failed"  # finish_reason "error", a 5xx, an error chunk: a decode failure reached the client
ENDED_CANCELLED = "ended_cancelled"  # ended "cancelled" (or 503) though nobody cancelled or shut down
UNEXPECTED = "unexpected"  # anything else: an exception, a wrong status, an unreadable body
HUNG = "hung"  # no outcome by the round's deadline

# What each kind of job may end as; anything else is a violation.
ALLOWED = {
    "complete": {COMPLETED, OVERLOADED},
    "cancel": {CLIENT_CANCELLED, COMPLETED, OVERLOADED},
    "disconnect": {CLIENT_CANCELLED, COMPLETED, OVERLOADED},
    "timeout": {TIMED_OUT, COMPLETED, OVERLOADED},
    "malformed": {REJECTED},
}


@attrs.define
class Outcome:
    """One request's ending and the evidence the checks need."""

    job_id: str
    kind: str
    status: str = UNEXPECTED
    finish_reason: str | None = None
    max_tokens: int = 0
    priority: int = 0
    greedy: bool = False
    # engine: every TokenEvent's (index, has token, final) in arrival order
    tokens: list[int] = attrs.field(factory=list)
    indices: list[int] = attrs.field(factory=list)
    finals: int = 0  # final events / finish chunks seen
    final_last: bool = True  # the final event (if any) was the last thing seen
    completion_tokens: int | None = None  # from usage
    text: str = ""
    # server
    http_status: int | None = None
    expected_status: int | None = None
    error_body_ok: bool | None = None  # a 4xx/5xx carried {"error": {"message": str, "type": str, ...}}
    done: int = 0  # "[DONE]" lines seen
    after_done: int = 0  # data lines after "[DONE]"
    response_ids: list[str] = attrs.field(factory=list)  # distinct ids the response used
    chunks: int = 0  # content chunks with text
    detail: str = ""  # the error, exception or reason, for the report
    ttft_s: float | None = None

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in attrs.asdict(self).items() if k not in ("tokens", "indices", "text")}
