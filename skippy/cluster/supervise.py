"""Running a ClusterPlan: every replica and the router as child processes of one trio nursery.

Each child runs in its own session (process group), its output in a log file of its own. Start:
the replicas (and any joined --worker-urls) until /health answers 200, then the router until it
lists every replica healthy. While running, a child that exits is started again (with a backoff
if it keeps dying); the router's health checks keep a replica out of rotation until it is back.
Stop (Ctrl-C, SIGTERM, or the caller's trigger): the router first (it stops taking requests and
finishes the ones in flight, within its grace period), then the replicas (each drains: new work
503, in-flight work finishes); whatever is still there past the deadline is killed with its whole
process group. A second Ctrl-C kills at once.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable

import attrs
import httpx
import trio

from ..errors import SkippyError
from .plan import ClusterPlan

POLL_S = 0.2  # between health polls while a child starts
KILL_GRACE_S = 5.0  # past its own deadline, before a child's process group is killed
REPEAT_S = 1.0  # a signal this soon after the first is not a second Ctrl-C


class ClusterStartError(SkippyError):
    """A replica or the router exited or did not answer in time while the cluster started."""


@attrs.define(eq=False)
class Child:
    """One supervised process: what it runs, where it logs, what says it is up."""

    name: str
    key: str  # its URL, or "router"
    argv: tuple[str, ...]
    log: Path
    env: dict[str, str] | None = None  # None: the supervisor's
    proc: trio.Process | None = None
    restarts: int = 0


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text if line.strip())


def trust_bundle(ca: Path, log_dir: Path) -> Path:
    """The system's CA bundle plus `ca`, for the router's $SSL_CERT_FILE. sglang-router 0.3.2 gives
    --ca-cert-paths to the client it routes with, but its periodic health checks and its /server_info
    fetch (core/worker.rs, discover_metadata.rs) use clients of their own that trust only the system
    store: without this they fail on replicas whose certificate a private CA signed (workers flap
    unhealthy, the model is 'unknown'). The system's roots stay, for public https --worker-urls."""
    system = ssl.get_default_verify_paths().cafile
    parts = [Path(system).read_bytes()] if system and Path(system).is_file() else []
    bundle = log_dir / "router-trust.pem"
    bundle.write_bytes(b"\n".join([*parts, ca.read_bytes()]))
    return bundle


def _say(text: str) -> None:
    print(f"skippy cluster: {text}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, plan: ClusterPlan, log_dir: Path, *, api_key: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.plan = plan
        self.log_dir = log_dir
        self.api_key = api_key
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONUNBUFFERED"] = "1"
        if api_key:
            self.env["SKIPPY_API_KEY"] = api_key  # read by `skippy serve` and by _router_main
        self.replicas = [Child(f"replica {r.index}", r.url, r.argv, log_dir / f"replica-{r.index}.log")
                         for r in plan.replicas]
        ca = plan.spec.tls_ca or plan.spec.tls_cert
        router_env = {**self.env, "SSL_CERT_FILE": str(trust_bundle(Path(ca), log_dir))} if ca else None
        self.router = Child("router", "router", plan.router_argv, log_dir / "router.log", router_env)
        self.stopping = False
        self.force = trio.Event()  # a second signal: kill now
        self._verify: Any = ssl.create_default_context(cafile=ca) if ca else True

    @property
    def children(self) -> list[Child]:
        return [*self.replicas, self.router]

    def pids(self) -> dict[str, int]:
        return {c.key: c.proc.pid for c in self.children if c.proc is not None}

    def client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.AsyncClient(verify=self._verify, timeout=5.0, headers=headers)

    # -- one child ----------------------------------------------------------------------

    async def spawn(self, child: Child) -> None:
        with open(child.log, "ab") as log:  # the child keeps its own descriptor
            child.proc = await trio.lowlevel.open_process(list(child.argv), stdin=subprocess.DEVNULL, stdout=log,
                                                          stderr=subprocess.STDOUT, env=child.env or self.env,
                                                          start_new_session=True)

    async def _until(self, child: Child | None, what: str, ready: Callable[[], Awaitable[bool]],
                     timeout: float) -> None:
        """Poll `ready` until True; a child that exits meanwhile, or the timeout, fails the start."""
        with trio.move_on_after(timeout) as scope:
            while not await ready():
                if child is not None and child.proc is not None and child.proc.poll() is not None:
                    raise ClusterStartError(f"{child.name} exited with code {child.proc.returncode} while "
                                            f"starting ({what}); its log {child.log}: {_tail(child.log)}")
                await trio.sleep(POLL_S)
        if scope.cancelled_caught:
            log = f"; its log {child.log}: {_tail(child.log)}" if child is not None else ""
            raise ClusterStartError(f"{child.name if child else what} did not answer within {timeout:g} s "
                                    f"({what}){log}")

    async def healthy(self, http: httpx.AsyncClient, url: str) -> bool:
        try:
            return (await http.get(f"{url}/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def router_ready(self, http: httpx.AsyncClient) -> bool:
        """The router lists every replica, each healthy (sglang-router's GET /workers)."""
        try:
            r = await http.get(f"{self.plan.router_url}/workers")
            workers = r.json().get("workers", []) if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return False
        healthy = {w.get("url") for w in workers if w.get("is_healthy")}
        return all(u in healthy for u in self.plan.worker_urls)

    async def start_replica(self, child: Child, timeout: float) -> None:
        await self.spawn(child)
        async with self.client() as http:
            await self._until(child, f"GET {child.key}/health", lambda: self.healthy(http, child.key), timeout)

    async def start_router(self, timeout: float) -> None:
        await self.spawn(self.router)
        async with self.client() as http:
            await self._until(self.router, f"every replica healthy at {self.plan.router_url}/workers",
                              lambda: self.router_ready(http), timeout)

    async def keep(self, child: Child, timeout: float) -> None:
        """Start `child` again each time it exits, until the cluster stops."""
        while True:
            assert child.proc is not None
            rc = await child.proc.wait()
            if self.stopping:
                return
            child.restarts += 1
            delay = min(30.0, 0.5 * 2 ** min(child.restarts - 1, 6))
            _say(f"{child.name} ({child.key}) exited with code {rc}; starting it again in {delay:g} s")
            await trio.sleep(delay)
            try:
                if child is self.router:
                    await self.start_router(timeout)
                else:
                    await self.start_replica(child, timeout)
            except ClusterStartError as exc:
                _say(str(exc))
                continue
            child.restarts = 0
            _say(f"{child.name} is back ({child.key})")

    # -- stopping ---------------------------------------------------------------------------

    async def stop_child(self, child: Child, deadline: float) -> None:
        """SIGTERM its process group, wait up to `deadline` (or a second signal), then SIGKILL the group."""
        proc = child.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # its pid is its group (own session); not reaped yet: still ours
        except ProcessLookupError:
            pass
        with trio.move_on_after(deadline):
            async with trio.open_nursery() as nursery:
                async def forced() -> None:
                    await self.force.wait()
                    nursery.cancel_scope.cancel()
                nursery.start_soon(forced)
                await proc.wait()
                nursery.cancel_scope.cancel()
        if proc.poll() is None:
            _say(f"{child.name} did not stop in time: killed")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()

    async def shutdown(self) -> None:
        """The router first (it finishes what it is forwarding), then every replica at once."""
        self.stopping = True
        deadline = self.plan.spec.shutdown_deadline + KILL_GRACE_S
        await self.stop_child(self.router, deadline)
        async with trio.open_nursery() as nursery:
            for child in self.replicas:
                nursery.start_soon(self.stop_child, child, deadline)


async def _signals(stop: trio.Event, force: trio.Event) -> None:
    """SIGINT/SIGTERM: the first stops the cluster gracefully, a second kills what is left at once. One
    that comes within REPEAT_S of the first is the same event twice (`timeout` signals its child and
    then its whole group), not a second Ctrl-C."""
    first = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for _ in received:
            if first is None:
                first = trio.current_time()
                _say("stopping: the router, then the replicas (each finishes what it is serving; "
                     "Ctrl-C again to kill)")
                stop.set()
            elif trio.current_time() - first > REPEAT_S:
                _say("killing everything now")
                force.set()
                return


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _start_and_keep(sup: Supervisor, on_ready: Callable[[Supervisor, str | None], None],
                          startup_timeout: float) -> None:
    async with sup.client() as http, trio.open_nursery() as starting:  # replicas load side by side
        for child in sup.replicas:
            starting.start_soon(sup.start_replica, child, startup_timeout)
        for u in sup.plan.spec.worker_urls:  # joined replicas: only waited for
            starting.start_soon(sup._until, None, f"GET {u}/health", partial(sup.healthy, http, u), startup_timeout)
    await sup.start_router(startup_timeout)
    model = await _model_name(sup)
    async with trio.open_nursery() as nursery:
        for child in sup.children:
            nursery.start_soon(sup.keep, child, startup_timeout)
        on_ready(sup, model)


async def run(plan: ClusterPlan, log_dir: Path, *, on_ready: Callable[[Supervisor, str | None], None],
              api_key: str | None = None, startup_timeout: float = 600.0, stop: trio.Event | None = None,
              watch_signals: bool = True) -> None:
    """Start everything in `plan`, call `on_ready`, and keep it running until `stop` is set (or, with
    `watch_signals`, SIGINT/SIGTERM), then stop it all. Whatever was started is stopped on the way out,
    whatever the reason (a failed start, a signal during the start)."""
    sup = Supervisor(plan, log_dir, api_key=api_key)
    stop = stop if stop is not None else trio.Event()
    async with trio.open_nursery() as outer:
        if watch_signals:
            outer.start_soon(_signals, stop, sup.force)
        try:
            with trio.CancelScope() as running:
                outer.start_soon(_cancel_on, stop, running)
                await _start_and_keep(sup, on_ready, startup_timeout)
        finally:
            with trio.CancelScope(shield=True):
                await sup.shutdown()
        outer.cancel_scope.cancel()


async def _model_name(sup: Supervisor) -> str | None:
    """What the router's /v1/models names (the replicas' served model), for the ready line."""
    async with sup.client() as http:
        try:
            data = (await http.get(f"{sup.plan.router_url}/v1/models")).json().get("data", [])
        except (httpx.HTTPError, ValueError):
            return None
    return data[0].get("id") if data else None
