"""`skippy cluster` with an API key and TLS between the router and its replicas (one replica of the
tiny synthetic llama behind the real sglang-router): the key reaches the replica through the router
and stays out of every process list; the router keeps a replica whose certificate a private CA signed
healthy, and knows its model."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

pytest.importorskip("sglang_router", reason="the cluster tests run the real sglang-router: "
                                            "pip install 'skippy[cluster]' (./bootstrap --dev installs it)")

pytestmark = pytest.mark.cluster

MODEL = "llama-s0-v1"
KEY = "cluster-test-key-6d1f"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_api_key_and_tls_between_router_and_replicas(synth_model_path, tmp_path):
    trustme = pytest.importorskip("trustme")
    synth_model_path("llama")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = open(tmp_path / "cluster.err", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippy", "cluster", "--replicas", "1", "--family", "llama", "--port", str(port),
         "--json", "--threads-per-replica", "1", "--n-ctx", "1024", "--shutdown-deadline", "5",
         "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"),
         "--tls-ca", str(tmp_path / "ca.pem"), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
        env={**os.environ, "SKIPPY_API_KEY": KEY})
    info: dict = {}
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and proc.poll() is None and not line:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
        assert line, (tmp_path / "cluster.err").read_text()
        info = json.loads(line)
        # the router fetched /server_info over TLS with the key: it names the model
        assert info["model"] == MODEL and info["replicas"][0]["url"].startswith("https://")
        for pid in (info["router_pid"], info["replicas"][0]["pid"]):
            assert KEY.encode() not in _cmdline(pid) and b"--api-key" not in _cmdline(pid)
        with trio.fail_after(40):
            async with httpx.AsyncClient(base_url=info["router"], timeout=20) as http:
                ok = await http.post("/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                                     json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
                assert ok.status_code == 200, ok.text
                assert (await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})).status_code == 401
                await trio.sleep(2.5)  # past two health checks: the router's own clients trust the CA too
                workers = (await http.get("/workers", headers={"Authorization": f"Bearer {KEY}"})).json()["workers"]
                assert [w["is_healthy"] for w in workers] == [True]
            trust = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
            async with httpx.AsyncClient(verify=trust, timeout=10) as direct:
                replica = info["replicas"][0]["url"]
                assert (await direct.get(f"{replica}/v1/models")).status_code == 401  # the replica wants the key
        router_log = (tmp_path / "logs" / "router.log").read_text(errors="replace")
        assert "health check failed" not in router_log
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                for pid in [info.get("router_pid"), *(r["pid"] for r in info.get("replicas", []))]:
                    if pid:  # never leave a child behind a failed test
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        proc.stdout.close()
        err.close()
