"""skippy's /metrics read robustly: present metrics parsed, absent ones None, garbage nothing."""

from __future__ import annotations

import pytest

from bench.gate.prom import parse_scrape

pytestmark = pytest.mark.bench


SCRAPE = """\
# HELP skippy_requests_running Sequences in the running set
# TYPE skippy_requests_running gauge
skippy_requests_running 3.0
# TYPE skippy_kv_used_cells gauge
skippy_kv_used_cells{component="attn"} 384.0
skippy_kv_used_cells{component="recurrent"} 3.0
# TYPE skippy_prefix_cache_queries_tokens_total counter
skippy_prefix_cache_queries_tokens_total 1200.0
# TYPE skippy_prefix_cache_hits_tokens counter
skippy_prefix_cache_hits_tokens_total 900.0
skippy_prefix_cache_hits_tokens_created 1.7e9
# TYPE skippy_preemptions_total counter
skippy_preemptions_total 2.0
# TYPE skippy_prefix_cache_resident_tokens gauge
skippy_prefix_cache_resident_tokens 96.0
"""


def test_scrape_reads_skippy_metrics():
    s = parse_scrape(SCRAPE)
    assert s.kv_used == {"attn": 384.0, "recurrent": 3.0}
    assert (s.running, s.prefix_queries, s.prefix_hits, s.preemptions, s.prefix_resident) == (3.0, 1200.0, 900.0, 2.0, 96.0)


def test_scrape_tolerates_missing_metrics_and_garbage():
    s = parse_scrape("skippy_requests_running 1\n")
    assert (s.running, s.kv_used, s.prefix_queries, s.prefix_hits, s.prefix_resident) == (1.0, {}, None, None, None)
    garbage = parse_scrape("<html>not found</html>\n{{{")
    assert (garbage.running, garbage.kv_used) == (None, {})
