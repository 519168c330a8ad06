"""Server subprocesses: start on a free loopback port, wait until healthy, always stop.

Every server is stopped on the way out, whatever happened (shielded from cancellation):
SIGTERM first so it can drain, SIGKILL to its process group after a grace period. Its output
goes to a log file whose tail is quoted when it fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Sequence

import attrs
import httpx
import trio


class ServerStartError(RuntimeError):
    """The server exited or never answered /health in time."""


@attrs.frozen
class Server:
    url: str
    pid: int
    model_id: str
    argv: tuple[str, ...]


def free_port() -> int:
    """A loopback port the OS says is free now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM) in MiB; None where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def log_tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


async def _wait_healthy(proc: trio.Process, url: str, log: Path, timeout: float) -> str:
    """Poll /health until 200 (llama-server answers 503 while loading), then read the model id."""
    async with httpx.AsyncClient(timeout=5) as client:
        with trio.move_on_after(timeout) as scope:
            while True:
                if proc.poll() is not None:
                    raise ServerStartError(f"server exited with {proc.returncode} before it was healthy:\n"
                                           f"{log_tail(log)}")
                try:
                    if (await client.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await trio.sleep(0.2)
        if scope.cancelled_caught:
            raise ServerStartError(f"no healthy /health at {url} within {timeout:g} s:\n{log_tail(log)}")
        models = (await client.get(f"{url}/v1/models")).json()
        return str(models["data"][0]["id"])


async def stop_process(proc: trio.Process, grace: float) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL the whole process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(grace):
            await proc.wait()
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: start_new_session below
        except ProcessLookupError:
            pass
        await proc.wait()


@asynccontextmanager
async def running_server(argv: Sequence[str], port: int, log: Path, *, startup_timeout: float = 120,
                         stop_grace: float = 10) -> AsyncIterator[Server]:
    """A server started from `argv` (which must bind `port` on 127.0.0.1), healthy, stopped on exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = await trio.lowlevel.open_process(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            model_id = await _wait_healthy(proc, url, log, startup_timeout)
            yield Server(url, proc.pid, model_id, tuple(argv))
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(proc, stop_grace)
