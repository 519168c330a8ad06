"""Prometheus metrics of one app: a registry of its own (never the process-global one), so
several apps in one process (tests, a user's nursery) do not collide.

Engine state (running, waiting, KV per component, preemptions, finishes, rejections) is read
from `engine.stats()` at scrape time by a collector; latency histograms are observed by the
server from the times it sees events.
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_DELIVERY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class _EngineCollector(Collector):
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        s = self.engine.stats()
        yield GaugeMetricFamily("skippy_requests_running", "Sequences in the running set", value=s.running)
        yield GaugeMetricFamily("skippy_requests_waiting", "Requests in the waiting queue", value=s.waiting)
        used = GaugeMetricFamily("skippy_kv_used_cells", "KV memory in use per component (cells or slots)",
                                 labels=["component"])
        free = GaugeMetricFamily("skippy_kv_free_cells", "KV memory free per component (cells or slots)",
                                 labels=["component"])
        ratio = GaugeMetricFamily("skippy_kv_usage_ratio", "Fraction of each KV component in use",
                                  labels=["component"])
        for kind, n in s.kv_used.items():
            name = getattr(kind, "name", str(kind)).lower()
            f = s.kv_free.get(kind, 0)
            used.add_metric([name], n)
            free.add_metric([name], f)
            ratio.add_metric([name], n / (n + f) if n + f else 0.0)
        yield used
        yield free
        yield ratio
        per_cell = GaugeMetricFamily("skippy_kv_bytes_per_cell",
                                     "Bytes of one cell (one state slot for recurrent) of each KV component",
                                     labels=["component"])
        for kind, b in s.kv_bytes_per_cell.items():
            per_cell.add_metric([getattr(kind, "name", str(kind)).lower()], b)
        yield per_cell
        yield CounterMetricFamily("skippy_preemptions", "Sequences preempted (recompute)", value=s.preemptions)
        yield CounterMetricFamily("skippy_queue_rejections", "Requests refused because the waiting queue was full",
                                  value=s.rejected)
        fin = CounterMetricFamily("skippy_requests_finished", "Requests finished, by finish reason", labels=["reason"])
        for reason, n in sorted(s.finished.items()):
            fin.add_metric([reason], n)
        yield fin
        yield CounterMetricFamily("skippy_engine_steps", "Engine steps (one mixed ubatch each)", value=s.steps)
        if s.slo_tpot_s is not None:  # the latency targets, once resolved (configured or derived at open)
            yield GaugeMetricFamily("skippy_slo_tpot_target_seconds", "The time-per-output-token target",
                                    value=s.slo_tpot_s)
        if s.slo_ttft_s is not None:
            yield GaugeMetricFamily("skippy_slo_ttft_target_seconds", "The time-to-first-token target (derived: a 128-token prompt's; each request's scales with its prompt)",
                                    value=s.slo_ttft_s)
        slo = CounterMetricFamily("skippy_slo_requests", "Finished requests by latency-target outcome: met both "
                                  "targets, missed one, or shed as late", labels=["outcome"])
        for outcome, n in (("met", s.slo_met), ("missed", s.slo_missed), ("shed", s.slo_shed)):
            slo.add_metric([outcome], n)
        yield slo
        yield CounterMetricFamily("skippy_step_busy_seconds",
                                  "Wall seconds from each step's start to the next one's while the engine is busy",
                                  value=s.t_busy)
        yield CounterMetricFamily("skippy_step_decode_seconds", "Of the busy seconds, those inside the runtime's decode",
                                  value=s.t_busy_decode)
        yield GaugeMetricFamily("skippy_step_overhead_ratio",
                                "Share of busy wall time outside the decode (every per-token cost of the engine)",
                                value=s.step_overhead_pct / 100.0)
        yield CounterMetricFamily("skippy_prompt_tokens", "Prompt tokens prefilled", value=s.prefill_tokens)
        yield CounterMetricFamily("skippy_generation_tokens", "Tokens generated", value=s.output_tokens)
        yield CounterMetricFamily("skippy_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                  unit="tokens", value=s.prefix_queries)
        yield CounterMetricFamily("skippy_prefix_cache_hits",
                                  "Prompt tokens shared from the prefix cache or a running sequence (not computed)",
                                  unit="tokens", value=s.prefix_hits)
        yield CounterMetricFamily("skippy_prefix_cache_evictions", "Resident prefixes evicted", value=s.prefix_evictions)
        yield CounterMetricFamily("skippy_fork_shared", "Prompt tokens the choices of n > 1 requests shared from "
                                  "their first choice (seq_cp, not computed)", unit="tokens",
                                  value=s.fork_shared_tokens)
        yield CounterMetricFamily("skippy_run_ahead_steps", "Steps routed on the worker thread while every running "
                                  "stream was written inline (scheduling.run_ahead)", value=s.run_ahead_steps)
        yield GaugeMetricFamily("skippy_prefix_cache_entries", "Resident prefixes held", value=s.prefix_entries)
        yield GaugeMetricFamily("skippy_prefix_cache_resident_tokens", "Tokens held by resident prefixes",
                                value=s.prefix_resident_tokens)
        yield _invariance_gauge(self.engine)


def _invariance_gauge(engine: Any) -> GaugeMetricFamily:
    """1 while the engine runs batch-invariant kernels; `verified` is the self-check's verdict on
    this model and build (skippy.check): true, false, or unknown when it was not run (nor cached)."""
    gauge = GaugeMetricFamily("skippy_batch_invariant",
                              "1 when batch-invariant kernels are on; verified: the self-check's verdict",
                              labels=["verified"])
    config = getattr(engine, "config", None)
    result = getattr(engine, "invariance", None)
    verified = "unknown" if result is None else ("true" if result.identical else "false")
    gauge.add_metric([verified], 1.0 if getattr(config, "batch_invariant", False) else 0.0)
    return gauge


class _WritesCollector(Collector):
    def __init__(self, metrics: "ServerMetrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily("skippy_stream_writes", "Writes of streamed completion chunks (tool-call "
                                     "streams aside), by who made them: the engine step (inline) or the "
                                     "response's task", labels=["path"])
        family.add_metric(["inline"], self.metrics.writes_inline)
        family.add_metric(["task"], self.metrics.writes_task)
        yield family


class ServerMetrics:
    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine))
        self.writes_inline = 0  # plain counts (read at scrape time): a Counter's lock per token is not free
        self.writes_task = 0
        self.registry.register(_WritesCollector(self))
        self.ttft = Histogram("skippy_time_to_first_token_seconds",
                              "Seconds from a request's arrival at the server to its first token",
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("skippy_time_per_output_token_seconds",
                              "Mean seconds between a request's output tokens after the first",
                              buckets=_TPOT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("skippy_request_latency_seconds", "Seconds from arrival to the last token",
                             buckets=_TTFT_BUCKETS, registry=self.registry)
        self.delivery = Histogram("skippy_token_delivery_seconds",
                                  "Seconds from a token's sampling to its SSE bytes written (per write: its oldest token)",
                                  buckets=_DELIVERY_BUCKETS, registry=self.registry)

    def observe(self, t_arrival: float, t_first: float | None, t_last: float | None, n_tokens: int) -> None:
        if t_first is None:
            return
        self.ttft.observe(t_first - t_arrival)
        if t_last is not None:
            self.e2e.observe(t_last - t_arrival)
            if n_tokens > 1:
                self.tpot.observe((t_last - t_first) / (n_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
