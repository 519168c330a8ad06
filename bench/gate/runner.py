"""One run: a workload under one load against one live server, warm-up excluded.

The warm-up requests (own prompts, same system prompt) go first and are kept in the records
but marked; the measured phase starts after them, and its wall time is what throughput and
goodput divide by. While it runs, a sampler reads skippy's /metrics (KV cells in use,
running sessions and, where exposed, the step overhead ratio); the prefix-cache counters are
read before and after so their delta is this run's alone. Servers without skippy's metrics
simply leave those readings empty.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import attrs
import httpx
import trio

from .client import completion_body, stream_completion
from .loadgen import closed_loop, open_loop, poisson_offsets
from .metrics import cells_per_session, counter_delta_ratio, mean
from .prom import Scrape, parse_scrape
from .procs import Server
from .records import Load, RequestRecord, RunResult
from .workloads import Vocab, Workload, make_prompts


@attrs.frozen
class RunConfig:
    """How many requests a run sends and how (shared by every engine of a sweep)."""

    requests_per_worker: int = 3  # closed loop: count = max(min_requests, requests_per_worker * N)
    min_requests: int = 16
    poisson_requests: int = 64
    warmup: int = 2
    temperature: float = 0.0
    seed: int = 0
    metrics_interval: float = 0.5
    sampling: Mapping[str, Any] = attrs.field(factory=dict)  # body fields over `temperature` (--sampling)

    def count(self, load: Load) -> int:
        if load.kind == "poisson":
            return self.poisson_requests
        return max(self.min_requests, self.requests_per_worker * (load.n or 1))


async def scrape(client: httpx.AsyncClient, url: str) -> Scrape | None:
    """skippy's metrics now, or None when the server has none (llama-server without --metrics)."""
    try:
        response = await client.get(f"{url}/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    s = parse_scrape(response.text)
    return s if s.running is not None or s.kv_used else None


async def _sample(client: httpx.AsyncClient, url: str, interval: float, out: list[Scrape]) -> None:
    """Until cancelled; a scrape that fails (a busy server) is skipped, not the end of sampling."""
    while True:
        if (s := await scrape(client, url)) is not None:
            out.append(s)
        await trio.sleep(interval)


def step_overhead(before: Scrape, after: Scrape, samples: list[Scrape]) -> float | None:
    """The share of the engine's busy time outside the decode over this run alone: from the busy
    and decode seconds counters where the server has them, else the mean of the sampled ratio
    gauge (since the server started), else its reading at the end; None on a server without either."""
    if None not in (before.step_busy, after.step_busy, before.step_decode, after.step_decode):
        busy = after.step_busy - before.step_busy  # type: ignore[operator]
        decode = after.step_decode - before.step_decode  # type: ignore[operator]
        return (busy - decode) / busy if busy > 0 else None
    gauges = [s.step_overhead for s in samples if s.step_overhead is not None]
    return mean(gauges) if gauges else after.step_overhead


def server_readings(before: Scrape | None, after: Scrape | None, samples: list[Scrape]) -> dict[str, Any]:
    """Prefix hit rate and counters over the run, KV cells per running session per component."""
    if before is None or after is None:
        return {}

    def delta(name: str) -> float | None:
        a, b = getattr(after, name), getattr(before, name)
        return None if a is None or b is None else a - b

    components = sorted({c for s in samples for c in s.kv_used})
    per_session = {c: cells_per_session((s.kv_used.get(c, 0.0), s.running or 0.0) for s in samples)
                   for c in components}
    return {
        "prefix_hit_rate": counter_delta_ratio(before.prefix_hits, after.prefix_hits,
                                               before.prefix_queries, after.prefix_queries),
        "prefix_queries_tokens": delta("prefix_queries"),
        "prefix_hits_tokens": delta("prefix_hits"),
        "preemptions": delta("preemptions"),
        "queue_rejections": delta("rejections"),
        "prefix_resident_tokens_end": after.prefix_resident,  # in the used cells too (maybe shared with sessions)
        "step_overhead_ratio": step_overhead(before, after, samples),
        "step_overhead_ratio_end": after.step_overhead,  # the server's gauge: since it started
        "kv_cells_per_session": per_session,
        "kv_bytes_per_session": kv_bytes_per_session(per_session, after.kv_bytes_per_cell),
    }


def kv_bytes_per_session(cells: dict[str, dict[str, float | None]], per_cell: dict[str, float]) -> dict[str, float]:
    """Mean KV bytes a running session held per component: mean cells x bytes per cell (for a
    recurrent component a cell is one state slot); components without both readings are left out."""
    return {c: v["mean"] * per_cell[c] for c, v in cells.items() if v.get("mean") is not None and c in per_cell}


def request_body(model: str, prompt: list[int], max_tokens: int, cfg: RunConfig, i: int) -> dict[str, Any]:
    """The i-th request's body: greedy at `cfg.temperature`, with `cfg.sampling`'s fields over it."""
    return {**completion_body(model, prompt, max_tokens, cfg.temperature, cfg.seed + i), **cfg.sampling}


async def run_one(server: Server, client: httpx.AsyncClient, engine: str, workload: Workload, load: Load,
                  vocab: Vocab, cfg: RunConfig, progress: Callable[[], None] = lambda: None) -> RunResult:
    """Warm up, then measure `workload` under `load`; every request's record is kept."""
    count = cfg.count(load)
    prompts = make_prompts(workload, vocab, count, cfg.seed, "measured")
    warm_prompts = make_prompts(workload, vocab, cfg.warmup, cfg.seed, "warmup")

    def sender(batch: list[list[int]], warmup: bool, t0: list[float]) -> Callable[[int], Any]:
        async def send(i: int) -> RequestRecord:
            body = request_body(server.model_id, batch[i], workload.output_len, cfg, i)
            rec = await stream_completion(client, server.url, body, index=i, warmup=warmup, t0=t0[0])
            if not warmup:
                progress()
            return rec
        return send

    origin = [time.perf_counter()]
    warm = await closed_loop(load.n or 1, cfg.warmup, sender(warm_prompts, True, origin))
    before = await scrape(client, server.url)
    samples: list[Scrape] = []
    origin[0] = time.perf_counter()
    async with trio.open_nursery() as nursery:
        if before is not None:  # the server has skippy's metrics
            nursery.start_soon(_sample, client, server.url, cfg.metrics_interval, samples)
        send = sender(prompts, False, origin)
        if load.kind == "closed":
            records = await closed_loop(load.n or 1, count, send)
        else:
            records = await open_loop(poisson_offsets(load.rate or 1.0, count, cfg.seed), send)
        duration = time.perf_counter() - origin[0]
        nursery.cancel_scope.cancel()
    after = await scrape(client, server.url)
    return RunResult(engine=engine, workload=workload.name, load=load, duration=duration, requests=warm + records,
                     server=server_readings(before, after, samples))
