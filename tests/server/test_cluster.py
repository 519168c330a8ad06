"""`skippy cluster` for real: two `skippy serve` replicas of the tiny synthetic llama behind the real
sglang-router binary, started once for the module as a user would (`skippy cluster --json`).

In order: the router reads every worker endpoint (its /workers, /get_loads, /flush_cache, /v1/models
answer from what it parsed); a multi-turn session stays on the replica holding its prefix; killing
a replica mid-run loses nothing that was not on it; SIGTERM drains through the router and leaves no
process behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from _procs import stop_process
from ._live import metric

pytest.importorskip("sglang_router", reason="the cluster tests run the real sglang-router: "
                                            "pip install 'skippy[cluster]' (./bootstrap --dev installs it)")

pytestmark = pytest.mark.cluster

MODEL = "llama-s0-v1"  # the synthetic llama's file stem: what every replica serves and the router names


@attrs.define
class Cluster:
    proc: subprocess.Popen
    info: dict
    log_dir: Path

    @property
    def router(self) -> str:
        return self.info["router"]

    @property
    def replicas(self) -> list[dict]:
        return self.info["replicas"]

    def stderr(self) -> str:
        return (self.log_dir / "cluster.err").read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving_pids(ports: list[int]) -> list[int]:
    """`skippy serve` processes listening on any of `ports` (by their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and any(str(p).encode() in argv for p in ports) and b"skippy" in argv:
            found.append(int(entry.name))
    return found


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def cluster(synth_model_path, tmp_path_factory):
    synth_model_path("llama")
    log_dir = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    with open(log_dir / "cluster.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "skippy", "cluster", "--replicas", "2", "--family", "llama", "--port", str(port),
             "--json", "--threads-per-replica", "1", "--n-ctx", "2048", "--shutdown-deadline", "10",
             "--startup-timeout", "90", "--log-dir", str(log_dir)],
            stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    ports: list[int] = []
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
                break
        assert line, f"skippy cluster did not get ready: {(log_dir / 'cluster.err').read_text()}"
        info = json.loads(line)
        ports = [int(r["url"].rsplit(":", 1)[1]) for r in info["replicas"]]
        yield Cluster(proc, info, log_dir)
    finally:
        stop_process(proc, 40, group=True)
        proc.stdout.close()
        for pid in _serving_pids(ports):  # only if a test failed half-way: never leave one behind
            os.kill(pid, signal.SIGKILL)


async def test_the_router_reads_every_worker_endpoint(cluster):
    urls = sorted(r["url"] for r in cluster.replicas)
    with trio.fail_after(30):
        async with httpx.AsyncClient(base_url=cluster.router, timeout=10) as http:
            # answered from the model ids the router made of /server_info (`unknown` before it existed)
            assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == [MODEL]
            workers = (await http.get("/workers")).json()["workers"]
            assert sorted(w["url"] for w in workers) == urls
            for w in workers:
                assert w["is_healthy"] and w["model_id"] == MODEL
                meta = w["metadata"]  # the labels discover_metadata.rs kept from /server_info and /model_info
                assert meta["served_model_name"] == MODEL and meta["model_path"].endswith(".gguf")
                assert meta["model_type"] == "llama" and meta["dp_size"] == "1"
            loads = (await http.get("/get_loads")).json()["workers"]
            assert sorted(w["worker"] for w in loads) == urls
            assert all(w["load"] == 0 for w in loads)  # -1 is the router's "could not read /get_load"
            flushed = (await http.post("/flush_cache")).json()
            assert flushed["status"] == "success" and flushed["workers_flushed"] == 2
            assert (await http.get("/get_model_info")).json()["model_type"] == "llama"  # proxied to a worker


async def _metrics(http: httpx.AsyncClient, url: str) -> tuple[float, float]:
    text = (await http.get(f"{url}/metrics")).text
    return metric(text, "skippy_prompt_tokens_total"), metric(text, "skippy_prefix_cache_hits_tokens_total")


async def test_a_sessions_turns_land_on_the_replica_holding_its_prefix(cluster):
    system = ("You are the archivist of a very long and very particular library. " * 8).strip()
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Where is the first shelf?"}]
    urls = [r["url"] for r in cluster.replicas]
    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.post(f"{cluster.router}/flush_cache")).json()["workers_flushed"] == 2
            before = {u: await _metrics(http, u) for u in urls}
            for turn in range(4):
                r = await http.post(f"{cluster.router}/v1/chat/completions",
                                    json={"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0})
                assert r.status_code == 200, r.text
                messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": f"And the shelf after that, number {turn + 2}?"}]
            after = {u: await _metrics(http, u) for u in urls}
    prefilled = {u: after[u][0] - before[u][0] for u in urls}
    hits = {u: after[u][1] - before[u][1] for u in urls}
    holder = max(urls, key=lambda u: prefilled[u])
    (other,) = [u for u in urls if u != holder]
    assert prefilled[holder] > 0 and hits[holder] > 0  # turns 2-4 shared what turn 1 left there
    assert prefilled[other] == 0 and hits[other] == 0  # nothing of the session was computed twice


async def test_killing_a_replica_loses_only_what_was_in_flight_on_it(cluster):
    long = {"model": MODEL, "max_tokens": 300, "ignore_eos": True}
    results: dict[str, tuple] = {}

    async def streamed(http, i):
        try:
            async with http.stream("POST", "/v1/completions", json={**long, "prompt": f"stream {i} " * 4,
                                                                   "stream": True}) as r:
                events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            results[f"s{i}"] = ("done", r.status_code, events[-1] if events else None)
        except httpx.TransportError as exc:  # the router closes a stream whose replica died mid-body
            results[f"s{i}"] = ("broken", type(exc).__name__, None)

    async def full(http, i, key, body):
        r = await http.post("/v1/completions", json={**body, "prompt": f"request {i} " * 4})
        results[key] = ("done", r.status_code, r.json())  # an error is JSON too: never a hang or HTML

    with trio.fail_after(90):
        async with httpx.AsyncClient(base_url=cluster.router, timeout=60) as http:
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(streamed, http, i)
                    nursery.start_soon(full, http, i, f"f{i}", long)
                load = {}
                while sum(load.values()) < 4:  # most of the six in flight
                    await trio.sleep(0.05)
                    load = {r["url"]: (await http.get(f"{r['url']}/get_load")).json()[0]["num_reqs"]
                            for r in cluster.replicas}
                victim = max(cluster.replicas, key=lambda r: load[r["url"]])
                in_flight = load[victim["url"]]
                os.kill(victim["pid"], signal.SIGKILL)
                for j in range(12):  # new requests while the router finds out: every one is served
                    nursery.start_soon(full, http, 100 + j, f"new{j}", {"model": MODEL, "max_tokens": 4})
                    await trio.sleep(0.25)
            lost = [k for k, v in results.items() if v[0] == "broken" or v[1] != 200]
            assert all(results[f"new{j}"][1] == 200 for j in range(12)), results
            assert len(lost) <= in_flight, (in_flight, results)  # only what the dead replica held
            for key in lost:
                kind, status, body = results[key]
                assert kind == "broken" or (status >= 500 and "error" in body), results[key]
            for key, (kind, status, last) in results.items():
                if key.startswith("s") and kind == "done":
                    assert status == 200 and last == "data: [DONE]"
            # the cluster starts it again; the router's health check takes it back
            while True:
                workers = (await http.get("/workers")).json()["workers"]
                if all(w["is_healthy"] for w in workers) and len(workers) == 2:
                    break
                await trio.sleep(0.2)
            assert (await http.get(f"{victim['url']}/health")).status_code == 200
            r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "after", "max_tokens": 3})
            assert r.status_code == 200
    assert f"({victim['url']}) exited with code -9; starting it again" in cluster.stderr()


async def test_sigterm_drains_through_the_router_and_leaves_no_process(cluster):
    ports = [int(r["url"].rsplit(":", 1)[1]) for r in cluster.replicas]
    with trio.fail_after(60):
        async with httpx.AsyncClient(base_url=cluster.router, timeout=30) as http:
            body = {"model": MODEL, "prompt": "drain me", "max_tokens": 200, "ignore_eos": True, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith("data: "):
                        break
                cluster.proc.send_signal(signal.SIGTERM)  # mid-stream
                rest = [line async for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        rc = await trio.to_thread.run_sync(cluster.proc.wait, abandon_on_cancel=True)
    assert rc == 0, cluster.stderr()
    assert "skippy cluster: stopped" in cluster.stderr() and "killed" not in cluster.stderr()
    assert not _alive(cluster.info["router_pid"])
    assert _serving_pids(ports) == []
