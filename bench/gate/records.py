"""The plain data every other module passes around: one request's timings, one run's key.

Kept free of I/O and of any computation so that the JSON written by a sweep is exactly these
records (attrs.asdict) and the gate can rebuild them from that JSON alone.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class RequestRecord:
    """What the client saw of one streamed request; times in seconds.

    `t_send` is relative to the start of its phase (warm-up or measured).
    `ttft` is send -> first chunk carrying text, `e2e` send -> last chunk carrying a choice
    (vLLM's definitions); `itl` the gaps between text chunks. `error` is None on success.
    """

    index: int
    warmup: bool
    t_send: float
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = attrs.field(factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)


@attrs.frozen
class Load:
    """How requests arrive: a closed loop of `n` workers, or Poisson arrivals at `rate` req/s."""

    kind: str  # "closed" | "poisson"
    n: int | None = None
    rate: float | None = None

    @classmethod
    def closed(cls, n: int) -> Load:
        return cls("closed", n=n)

    @classmethod
    def poisson(cls, rate: float) -> Load:
        return cls("poisson", rate=rate)

    @property
    def label(self) -> str:
        return f"N={self.n}" if self.kind == "closed" else f"{self.rate:g} req/s"

    @property
    def x(self) -> float:
        """The value plots put on the x axis: concurrency or arrival rate."""
        return float(self.n if self.kind == "closed" else self.rate)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Load:
        return cls(**data)


@attrs.define
class RunResult:
    """One (engine, workload, load) cell of a sweep: raw requests plus server-side readings."""

    engine: str
    workload: str
    load: Load
    duration: float  # seconds of the measured phase, first send -> last finish
    requests: list[RequestRecord]
    server: dict[str, Any] = attrs.field(factory=dict)  # peak RSS, KV cells per session, prefix counters

    def measured(self) -> list[RequestRecord]:
        return [r for r in self.requests if not r.warmup]

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        return cls(
            engine=data["engine"], workload=data["workload"], load=Load.from_json(data["load"]),
            duration=data["duration"], requests=[RequestRecord.from_json(r) for r in data["requests"]],
            server=data.get("server", {}),
        )
