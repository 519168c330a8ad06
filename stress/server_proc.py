"""`skippy serve` as a subprocess: started on a free loopback port, read through /metrics, stopped.

The server binds port 0 and prints the address it got, so no port is guessed. Its output goes
to a log file the run scans afterwards (an ERROR line or a traceback is a finding). It is
stopped with SIGINT, as a user would, and its exit status is part of the result; whatever
happens, it is killed on the way out (shielded from cancellation), so no server outlives a run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Sequence

import attrs
import httpx
import trio

from .proc_stats import open_fds, rss_mib

_SERVING = re.compile(r"serving (\S+) on (http://\S+)")


class ServerStartError(RuntimeError):
    """The server exited, or did not print its address, in time."""


@attrs.define
class Server:
    url: str
    model_id: str
    proc: trio.Process
    log: Path
    argv: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def open_fds(self) -> int:
        return open_fds(self.pid)

    async def fds_settled(self, at_most: int, timeout: float = 3.0) -> int:
        """The server's open fds once at most `at_most`, or whatever they are at the timeout."""
        with trio.move_on_after(timeout):
            while self.open_fds() > at_most:
                await trio.sleep(0.05)
        return self.open_fds()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    async def stop(self, grace: float = 30.0) -> int | None:
        """SIGINT (graceful drain), then SIGKILL after `grace` s; the exit status (None: killed)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            with trio.move_on_after(grace):
                await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
            return None
        return self.proc.returncode


def serve_argv(model: str | None, family: str | None, *, n_ctx: int, n_batch: int, n_seq_max: int, threads: int,
               max_waiting: int) -> list[str]:
    where = ["--model", model] if model else ["--family", family or "llama"]
    return [sys.executable, "-m", "skippy", "serve", *where, "--host", "127.0.0.1", "--port", "0",
            "--n-ctx", str(n_ctx), "--n-batch", str(n_batch), "--n-seq-max", str(n_seq_max),
            "--threads", str(threads), "--max-waiting", str(max_waiting), "--shutdown-deadline", "10"]


@asynccontextmanager
async def running_server(argv: Sequence[str], log: Path, start_timeout: float = 120.0) -> AsyncIterator[Server]:
    """Start the server, wait for its address, yield it; always stopped (killed if need be) on exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = await trio.lowlevel.open_process(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = None
    try:
        url = model_id = None
        with trio.move_on_after(start_timeout):
            while url is None:
                if proc.poll() is not None:
                    raise ServerStartError(f"skippy serve exited with {proc.returncode}:\n{_tail(log)}")
                m = _SERVING.search(log.read_text(errors="replace"))
                if m:
                    model_id, url = m.group(1), m.group(2)
                    break
                await trio.sleep(0.05)
        if url is None:
            raise ServerStartError(f"skippy serve printed no address within {start_timeout:g} s:\n{_tail(log)}")
        server = Server(url, model_id, proc, log, tuple(argv))
        yield server
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# -- /metrics -------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels as printed; no labels: just the name)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


async def metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """/metrics over a new connection each time (see server_run on keep-alive across pauses)."""
    r = await client.get(f"{url}/metrics", headers={"Connection": "close"})
    r.raise_for_status()
    return parse_metrics(r.text)


def finished_by_reason(m: dict[str, float]) -> dict[str, int]:
    out = {}
    for key, value in m.items():
        hit = re.fullmatch(r'skippy_requests_finished_total\{reason="(\w+)"\}', key)
        if hit:
            out[hit.group(1)] = int(value)
    return out


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Disconnect|Exit|Interrupt|Cancelled)\b.*$")


def log_findings(text: str) -> list[str]:
    """What the server's log shows failing: each loguru ERROR/CRITICAL line with the exception its
    traceback ends in ("message -> module.ExceptionType: detail"), a traceback printed outside
    loguru, and the runtime owner's "step failed" warnings (a decode or sampling exception)."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "| ERROR" in line or "| CRITICAL" in line:
            message = line.split(" - ", 1)[-1]
            exc, j = "", i + 1
            while j < len(lines) and "| " not in lines[j][:40]:
                if _EXCEPTION_LINE.match(lines[j]):
                    exc = lines[j]
                j += 1
            out.append(f"{message} -> {exc}" if exc else message)
            i = j
            continue
        if line.startswith("Traceback") or "step failed" in line or re.search(r"step \d+ failed for", line):
            out.append(line.split(" - ", 1)[-1].strip())
        i += 1
    return out
