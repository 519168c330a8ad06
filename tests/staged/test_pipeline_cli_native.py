"""`skippy pipeline --stages 3` serves the OpenAI API: the openai client against K processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _procs import stop_process

pytestmark = [pytest.mark.staged, pytest.mark.native]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_skippy_pipeline_three_stages_serves_the_openai_client(synth_model_path):
    openai = pytest.importorskip("openai", reason="the openai client is a dev extra")
    path = synth_model_path("llama", deep=True)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "skippy", "pipeline", "--model", str(path), "--stages", "3",
                             "--port", str(port), "--n-ctx", "512", "--n-batch", "64", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60)
        model = client.models.list().data[0].id
        done = client.completions.create(model=model, prompt=[300, 301, 302], max_tokens=5, temperature=0)
        assert done.usage.completion_tokens == 5 and done.choices[0].finish_reason in ("length", "stop")
        chunks = list(client.completions.create(model=model, prompt=[300, 301, 302], max_tokens=5, temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks) == done.choices[0].text
    finally:
        stop_process(proc)
    assert proc.returncode == 0
    # the launcher stopped its stage processes with it
    assert _processes_running(f"skippy\0stage\0--model\0{path}") == []


def _processes_running(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass  # it exited while we looked
    return found
