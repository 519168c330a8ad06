"""Replicas behind sglang-router: the same multi-turn chat workload routed to 1, 2 and 4 `skippy
serve` replicas by cache_aware, round_robin and power_of_two, prefix hit rate, prefill, TTFT and
goodput per policy (`python -m bench.replicas --help`)."""
