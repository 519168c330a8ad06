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


@attrs.frozen
class Scrape:
    """One /metrics reading: KV cells in use per component, running sessions, counters."""

    kv_used: dict[str, float]
    running: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    preemptions: float | None
    prefix_resident: float | None = None


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


def parse_scrape(text: str) -> Scrape:
    found = samples(text)
    kv = {labels.get("component", ""): v for labels, v in found.get(KV_USED, [])}
    return Scrape(kv_used=kv, running=_scalar(found, RUNNING), prefix_queries=_scalar(found, PREFIX_QUERIES),
                  prefix_hits=_scalar(found, PREFIX_HITS), preemptions=_scalar(found, PREEMPTIONS),
                  prefix_resident=_scalar(found, PREFIX_RESIDENT))


def scrape_json(s: Scrape) -> dict[str, Any]:
    return attrs.asdict(s)
