"""Stress runs: N concurrent sessions against the engine (in-process) and the server (over HTTP).

Each run is bounded (sessions x rounds, a deadline per round and per run), stops by itself,
prints its invariants and a JSON summary, and exits non-zero when one fails. Layout:

- workload.py    the seeded request mix (pure): lengths, kinds, priorities, malformed inputs
- outcomes.py    what each request ended as (plain data), shared by the drivers and the checks
- invariants.py  the checks (pure): none lost, none failed, streams well formed, memory idle, RSS, parity
- reference.py   the solo greedy reference on its own batch-invariant context (native, no trio)
- engine_run.py  driver: the engine in-process              (python -m stress.engine_run)
- server_run.py  driver: `skippy serve` over HTTP with httpx (python -m stress.server_run)
- server_proc.py the `skippy serve` subprocess: start on a free port, /metrics, RSS, stop
- soak.py        driver: a bounded soak of open-loop load, sampled over time (python -m stress.soak)
- soak_checks.py the soak's records and pass criteria (pure); soak_plot.py its soak.png
- report.py      printing and the results files under stress/results/<name>/
- cli.py         the options both drivers share
"""
