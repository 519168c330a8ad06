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


def test_step_overhead_is_read_when_exposed():
    assert parse_scrape(SCRAPE).step_overhead is None  # an older server: absent, not an error
    s = parse_scrape(SCRAPE + "# TYPE skippy_step_overhead_ratio gauge\nskippy_step_overhead_ratio 0.25\n")
    assert s.step_overhead == 0.25
    labelled = ('skippy_step_overhead_ratio{part="compose"} 0.1\nskippy_step_overhead_ratio{part="sample"} 0.2\n')
    assert parse_scrape(SCRAPE + labelled).step_overhead is None  # a ratio is never summed over labels


def test_run_readings_carry_the_step_overhead():
    from bench.gate.runner import server_readings

    before, after = parse_scrape(SCRAPE), parse_scrape(SCRAPE + "skippy_step_overhead_ratio 0.3\n")
    samples = [parse_scrape(SCRAPE + f"skippy_step_overhead_ratio {x}\n") for x in (0.1, 0.3)] + [before]
    got = server_readings(before, after, samples)  # no counters: the mean of the sampled gauge
    assert got["step_overhead_ratio"] == pytest.approx(0.2) and got["step_overhead_ratio_end"] == 0.3
    assert server_readings(before, before, [before])["step_overhead_ratio"] is None


def test_step_overhead_over_the_run_from_the_counters():
    from bench.gate.runner import server_readings

    def scrape(busy: float, decode: float, ratio: float):
        return parse_scrape(SCRAPE + f"# TYPE skippy_step_busy_seconds counter\nskippy_step_busy_seconds_total {busy}\n"
                            f"# TYPE skippy_step_decode_seconds counter\nskippy_step_decode_seconds_total {decode}\n"
                            f"skippy_step_overhead_ratio {ratio}\n")

    before, after = scrape(10.0, 5.0, 0.5), scrape(14.0, 8.0, 0.43)  # this run: 4 s busy, 3 s in the decode
    assert (before.step_busy, before.step_decode) == (10.0, 5.0)
    got = server_readings(before, after, [before, after])
    assert got["step_overhead_ratio"] == pytest.approx(0.25) and got["step_overhead_ratio_end"] == 0.43
    assert server_readings(before, before, [before])["step_overhead_ratio"] is None  # no busy time: undefined
