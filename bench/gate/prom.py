"""Reading skippy's /metrics (Prometheus text) into the few numbers the harness records. Pure.

Parsed with prometheus_client's own parser, and tolerant on purpose: a metric that is absent
(an older server, a counter not wired yet) reads as None, never as an error, so a sweep does
not depend on which server features have landed.
"""

from __future__ import annotations

from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families

KV_USED = "skippy_kv_used_cells"
RUNNING = "skippy_requests_running"
PREFIX_QUERIES = "skippy_prefix_cache_queries_tokens_total"
PREFIX_HITS = "skippy_prefix_cache_hits_tokens_total"
PREEMPTIONS = "skippy_preemptions_total"
PREFIX_RESIDENT = "skippy_prefix_cache_resident_tokens"  # tokens the prefix cache keeps resident
STEP_OVERHEAD = "skippy_step_overhead_ratio"  # a gauge: share of busy wall time outside the decode, since start
STEP_BUSY = "skippy_step_busy_seconds_total"  # the counters that ratio is made of: a run's own delta
STEP_DECODE = "skippy_step_decode_seconds_total"
KV_BYTES_PER_CELL = "skippy_kv_bytes_per_cell"  # per component: bytes of one cell (one state slot if recurrent)
QUEUE_REJECTIONS = "skippy_queue_rejections_total"  # requests answered 429 (waiting queue full)


@attrs.frozen
class Scrape:
    """One /metrics reading: KV cells in use per component, running sessions, counters."""

    kv_used: dict[str, float]
    running: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    preemptions: float | None
    prefix_resident: float | None = None
    step_overhead: float | None = None  # None on a server that does not expose it
    step_busy: float | None = None
    step_decode: float | None = None
    kv_bytes_per_cell: dict[str, float] = attrs.field(factory=dict)
    rejections: float | None = None


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by its exposed name (e.g. '..._total'); unparsable text yields nothing."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError:
        return {}
    return out


def _scalar(found: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    values = found.get(name)
    return sum(v for _, v in values) if values else None


def _gauge(found: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    """A ratio is not summed over labels: the unlabelled sample, or the only one, else None."""
    values = found.get(name) or []
    plain = [v for labels, v in values if not labels]
    if plain:
        return plain[0]
    return values[0][1] if len(values) == 1 else None


def parse_scrape(text: str) -> Scrape:
    found = samples(text)
    kv = {labels.get("component", ""): v for labels, v in found.get(KV_USED, [])}
    per_cell = {labels.get("component", ""): v for labels, v in found.get(KV_BYTES_PER_CELL, [])}
    return Scrape(kv_used=kv, running=_scalar(found, RUNNING), prefix_queries=_scalar(found, PREFIX_QUERIES),
                  prefix_hits=_scalar(found, PREFIX_HITS), preemptions=_scalar(found, PREEMPTIONS),
                  prefix_resident=_scalar(found, PREFIX_RESIDENT), step_overhead=_gauge(found, STEP_OVERHEAD),
                  step_busy=_scalar(found, STEP_BUSY), step_decode=_scalar(found, STEP_DECODE),
                  kv_bytes_per_cell=per_cell, rejections=_scalar(found, QUEUE_REJECTIONS))


def scrape_json(s: Scrape) -> dict[str, Any]:
    return attrs.asdict(s)
