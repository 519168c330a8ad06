"""One cell of the replica benchmark: `skippy cluster` started as a user would, the workload sent
through its router, every replica's and the router's counters read before and after, stopped.

The sessions run concurrently, each a closed loop over its own requests (a think time drawn
uniformly from half to one and a half times its mean between them); every request is a streamed chat completion with `ignore_eos`, so
output lengths are exact. What a cell returns is plain JSON, written to disk by the caller as soon
as the cell ends, so a long run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import trio

from bench.gate.client import stream_completion
from bench.gate.procs import free_port, log_tail
from bench.gate.prom import PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, samples

from .workload import Script, messages

PREFILLED = "skippy_prompt_tokens_total"  # prompt tokens computed (a hit's tokens are not)
ROUTER_COUNTERS = ("smg_worker_cb_outcomes_total", "smg_router_upstream_responses_total",
                   "smg_worker_selection_total", "smg_router_retries_total", "smg_http_responses_total")


@attrs.frozen
class Cell:
    sessions: int
    replicas: int
    policy: str
    round: int = 0

    @property
    def key(self) -> str:
        return f"s{self.sessions}-k{self.replicas}-{self.policy}-r{self.round}"


@attrs.frozen
class Setup:
    """What every cell of a run shares."""

    serve_args: tuple[str, ...]  # `skippy serve` flags for every replica (model, n_ctx, prefix slots)
    total_threads: int  # split evenly over the replicas (at least one each)
    gen: int = 32  # output tokens per request
    think_s: float = 1.0  # mean pause between a session's requests
    ramp_s: float = 5.0  # sessions start at uniform offsets within this
    seed: int = 0
    startup_timeout: float = 300.0

    def threads_per_replica(self, replicas: int) -> int:
        return max(1, self.total_threads // replicas)


def replica_counters(text: str) -> dict[str, float]:
    found = samples(text)
    return {key: sum(v for _, v in found.get(name, [])) for key, name in
            (("prefix_queries", PREFIX_QUERIES), ("prefix_hits", PREFIX_HITS), ("prefilled", PREFILLED),
             ("preemptions", PREEMPTIONS))}


def router_counters(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found = samples(text)
    return {name: found[name] for name in ROUTER_COUNTERS if name in found}


async def _ready_line(proc: trio.Process, timeout: float, err: Path) -> dict[str, Any]:
    buf = b""
    with trio.move_on_after(timeout):
        while b"\n" not in buf:
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                break
            buf += chunk
    if b"\n" not in buf:
        raise RuntimeError(f"skippy cluster did not get ready: {log_tail(err)}")
    return json.loads(buf.split(b"\n", 1)[0])


async def _stop(proc: trio.Process, grace: float = 60.0) -> None:
    """SIGTERM: the cluster drains and stops its children; past `grace`, kill what is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(grace):
            await proc.wait()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def _scrape(http: httpx.AsyncClient, url: str) -> str:
    r = await http.get(f"{url}/metrics")
    r.raise_for_status()
    return r.text


def cluster_argv(cell: Cell, setup: Setup, port: int, log_dir: Path) -> list[str]:
    return [sys.executable, "-m", "skippy", "cluster", "--replicas", str(cell.replicas), "--policy", cell.policy,
            "--port", str(port), "--json", "--threads-per-replica", str(setup.threads_per_replica(cell.replicas)),
            "--log-dir", str(log_dir), "--shutdown-deadline", "10", "--startup-timeout", f"{setup.startup_timeout:g}",
            *setup.serve_args]


async def run_cell(cell: Cell, script: Script, setup: Setup, log_dir: Path) -> dict[str, Any]:
    log_dir.mkdir(parents=True, exist_ok=True)
    err = log_dir / "cluster.err"
    with open(err, "wb") as err_file:
        proc = await trio.lowlevel.open_process(cluster_argv(cell, setup, free_port(), log_dir), stdin=subprocess.DEVNULL,
                                                stdout=subprocess.PIPE, stderr=err_file, start_new_session=True)
        try:
            info = await _ready_line(proc, setup.startup_timeout + 60, err)
            return await _measure(cell, script, setup, info)
        finally:
            with trio.CancelScope(shield=True):
                await _stop(proc)


async def _measure(cell: Cell, script: Script, setup: Setup, info: dict[str, Any]) -> dict[str, Any]:
    router, model = info["router"], info["model"]
    urls = [r["url"] for r in info["replicas"]]
    rng = np.random.default_rng([setup.seed, cell.sessions, cell.round])
    starts = rng.uniform(0, setup.ramp_s, size=len(script.sessions))
    # uniform over [0.5, 1.5] x the mean: a spread that de-synchronizes the sessions without the long
    # tail of an exponential (whose slowest session set a cell's wall time at twice the mean session's)
    thinks = [rng.uniform(0.5 * setup.think_s, 1.5 * setup.think_s, size=len(s)) for s in script.sessions]
    records: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=len(script.sessions) + 8, max_keepalive_connections=len(script.sessions) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:
        # warm each replica directly (the router's prefix tree stays empty): the first step's costs
        # are not part of any policy's figures
        for u in urls:
            body = {"model": model, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
            (await http.post(f"{u}/v1/chat/completions", json=body)).raise_for_status()
        before = {u: replica_counters(await _scrape(http, u)) for u in urls}
        router_before = router_counters(await _scrape(http, info["metrics"]))
        t0 = time.perf_counter()

        async def session(i: int) -> None:
            await trio.sleep(float(starts[i]))
            history: list[tuple[str, str]] = []
            for j, request in enumerate(script.sessions[i]):
                texts: list[str] = []
                body = {"model": model, "messages": messages(script, request, history), "max_tokens": setup.gen,
                        "temperature": 0.0, "seed": setup.seed, "stream": True,
                        "stream_options": {"include_usage": True}, "ignore_eos": True}
                rec = await stream_completion(http, router, body, index=len(records), warmup=False, t0=t0,
                                              path="/v1/chat/completions", texts=texts)
                records.append({**attrs.asdict(rec), "session": i, "turn": request.turn})
                if not request.one_shot and rec.ok:
                    history.append((request.user, "".join(texts)))
                if j + 1 < len(script.sessions[i]):  # the session ends with its last answer
                    await trio.sleep(float(thinks[i][j]))

        async with trio.open_nursery() as nursery:
            for i in range(len(script.sessions)):
                nursery.start_soon(session, i)
        wall = time.perf_counter() - t0
        after = {u: replica_counters(await _scrape(http, u)) for u in urls}
        router_after = router_counters(await _scrape(http, info["metrics"]))
    deltas = {u: {k: after[u][k] - before[u][k] for k in after[u]} for u in urls}
    return {"cell": attrs.asdict(cell), "key": cell.key, "threads_per_replica": setup.threads_per_replica(cell.replicas),
            "model": model, "wall_s": wall, "replicas": deltas, "router_before": router_before,
            "router_after": router_after, "records": records}
