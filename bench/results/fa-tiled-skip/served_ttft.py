"""Served TTFT of 1024-token prompts one after the other, each beside the cells the earlier ones left
resident (skippy's prefix cache), default kernels (`--no-batch-invariant`: the tiled flash-attention
kernel takes the prompt chunks). Patch 0014's probe.

    python bench/results/fa-tiled-skip/served_ttft.py LABEL [--prompts 8] [-- extra skippy serve args]

Prints one JSON line: {"label", "ttft_ms": [...], "isa"}. Run from the tree whose build it measures
(SKIPPY_CACHE selects the native build when two trees differ in patches/)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

from skippy.models import resolve_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("label")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--port", type=int, default=47311)
    p.add_argument("extra", nargs="*")
    a = p.parse_args()
    model = str(resolve_model(None))
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "skippy", "serve", "--model", model, "--host", "127.0.0.1",
                             "--port", str(a.port), "--threads", "2", "--n-ctx", "16384", "--n-batch", "512",
                             "--scheduler", "batched", "--no-batch-invariant", *a.extra],
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{a.port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        rng = np.random.default_rng(0)
        mid = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        ttft = []
        for _ in range(a.prompts):
            body = {"model": mid, "prompt": rng.integers(1000, 20000, size=1024).tolist(), "max_tokens": 4,
                    "ignore_eos": True, "stream": True}
            t, first = time.perf_counter(), None
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if first is None and line.startswith("data:") and "choices" in line:
                        first = time.perf_counter() - t
            ttft.append(round(1e3 * first))
        isa = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
        print(json.dumps({"label": a.label, "ttft_ms": ttft, "isa": isa}))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


if __name__ == "__main__":
    main()
