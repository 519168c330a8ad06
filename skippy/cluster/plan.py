"""What `skippy cluster` will start, decided before anything starts: pure (no processes, no trio).

A ClusterSpec comes from the command line; `plan` checks it and turns it into the argv of each
`skippy serve` replica and of the router (sglang-router, through `skippy.cluster._router_main`),
the ports they bind and the URLs the router reaches them on. `ready_line` / `ready_json` say what
runs once it does.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Callable, Sequence

import attrs

from ..errors import SkippyError

POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# serve flags the cluster sets itself for every replica (`skippy cluster` takes --host/--port for the router)
OWN_FLAGS = ("--host", "--port", "--threads")
# the router's health checks: a dead or draining replica leaves the rotation after one failed check,
# at most HEALTH_INTERVAL_S after it went; the router retries a request that failed there (a refused
# connection, a 5xx) for longer than that, so the retry finds it gone and goes to another replica
HEALTH_INTERVAL_S = 1
HEALTH_TIMEOUT_S = 5
RETRIES = ("--retry-max-retries", "6", "--retry-initial-backoff-ms", "100", "--retry-max-backoff-ms", "1000",
           "--retry-backoff-multiplier", "2")  # 100 + 200 + 400 + 800 + 1000 + 1000 ms
# after failures its circuit opens; a replica started again is tried after this, not sglang's 60 s
BREAKER = ("--cb-timeout-duration-secs", "5")
# cache_aware follows the longest cached prefix until the replicas' in-flight counts part by more
# than both bounds. sglang's defaults (64 apart and 1.5x) suit GPU servers with hundreds of lanes;
# a CPU replica runs a few, and under them a shared system prompt sent every new session to the
# replica that saw it first (bench/results/replicas/NOTES.md: 158 of 176 requests on one of four,
# TTFT p99 189 s against one replica's 70.8 s). Two in flight apart (and 1.5x) is a lane's worth more.
BALANCE = ("--balance-abs-threshold", "2", "--balance-rel-threshold", "1.5")


class ClusterConfigError(SkippyError):
    """The cluster's command line asks for something that cannot run (bad counts, flags, policy)."""


@attrs.frozen(kw_only=True)
class ClusterSpec:
    replicas: int  # local `skippy serve` replicas to start
    policy: str = "cache_aware"
    host: str = "127.0.0.1"  # the router's bind address
    port: int = 8080  # the router's port; local replicas take the next free ports after it
    replica_host: str = "127.0.0.1"  # where local replicas listen (and the router reaches them)
    threads_per_replica: int = 1
    serve_args: tuple[str, ...] = ()  # any other `skippy serve` flag, passed to every replica
    worker_urls: tuple[str, ...] = ()  # replicas already running elsewhere: the router routes to them too
    tls_cert: str | None = None  # replicas serve HTTPS with it (and its key); the router trusts tls_ca
    tls_key: str | None = None
    tls_ca: str | None = None  # the CA the router checks replicas' certificates against (default: tls_cert)
    shutdown_deadline: float = 30.0  # seconds in-flight requests may take after Ctrl-C / SIGTERM
    router_args: tuple[str, ...] = ()  # raw sglang-router flags, appended last (they win)
    python: str = sys.executable


@attrs.frozen
class Replica:
    """One local replica: its index, port, URL (as the router reaches it) and argv."""

    index: int
    port: int
    url: str
    argv: tuple[str, ...]


@attrs.frozen
class ClusterPlan:
    spec: ClusterSpec
    replicas: tuple[Replica, ...]
    router_url: str
    router_argv: tuple[str, ...]
    metrics_port: int  # the router's Prometheus exporter (bound on loopback)

    @property
    def worker_urls(self) -> tuple[str, ...]:
        """Every replica the router routes to: the local ones, then the joined ones."""
        return tuple(r.url for r in self.replicas) + self.spec.worker_urls


def url(host: str, port: int, tls: bool = False) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def port_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` now (a later bind may still lose a race). SO_REUSEADDR as
    the servers set it: a port whose last connections linger in TIME_WAIT is free to them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(n: int, start: int, *, taken: Sequence[int] = (), is_free: Callable[[int], bool]) -> list[int]:
    """The first `n` ports from `start` up that are not `taken` and that `is_free` says can be bound:
    replicas get predictable ports next to the router's (8081, 8082, ... for 8080)."""
    ports: list[int] = []
    port = start
    while len(ports) < n:
        if port > 65535:
            raise ClusterConfigError(f"no {n} free ports from {start} up")
        if port not in taken and is_free(port):
            ports.append(port)
        port += 1
    return ports


def check(spec: ClusterSpec) -> None:
    """Refuse what cannot run, in one line each."""
    if spec.replicas < 0:
        raise ClusterConfigError(f"--replicas must be >= 0, got {spec.replicas}")
    total = spec.replicas + len(spec.worker_urls)
    if total == 0:
        raise ClusterConfigError("nothing to route to: give --replicas K and/or --worker-urls URL...")
    if spec.policy not in POLICIES:
        raise ClusterConfigError(f"--policy must be one of {', '.join(POLICIES)}, got {spec.policy!r}")
    if spec.policy == "power_of_two" and total < 2:
        raise ClusterConfigError("--policy power_of_two picks the lighter of two replicas: it needs at least 2")
    if spec.threads_per_replica < 1:
        raise ClusterConfigError(f"--threads-per-replica must be >= 1, got {spec.threads_per_replica}")
    for flag in OWN_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in spec.serve_args):
            hint = "--threads-per-replica" if flag == "--threads" else "the cluster's own (the router's)"
            raise ClusterConfigError(f"{flag} is set by skippy cluster for each replica: use {hint}")
    for u in spec.worker_urls:
        if not u.startswith(("http://", "https://")):
            raise ClusterConfigError(f"--worker-urls takes http:// or https:// URLs, got {u!r}")
    if (spec.tls_cert is None) != (spec.tls_key is None):
        raise ClusterConfigError("a TLS certificate and its key go together (--tls-cert, --tls-key)")
    https_joined = any(u.startswith("https://") for u in spec.worker_urls)
    if spec.tls_ca is not None and spec.tls_cert is None and not https_joined:
        raise ClusterConfigError("--tls-ca is the CA of replicas served over HTTPS: give --tls-cert/--tls-key "
                                 "or https:// --worker-urls")


def replica_argv(spec: ClusterSpec, port: int) -> list[str]:
    """`skippy serve` with the passed-through flags, on its port and thread count; the API key, if
    any, travels in $SKIPPY_API_KEY (supervise), out of the process list."""
    argv = [spec.python, "-m", "skippy", "serve", *spec.serve_args, "--host", spec.replica_host, "--port", str(port),
            "--threads", str(spec.threads_per_replica), "--shutdown-deadline", f"{spec.shutdown_deadline:g}"]
    if spec.tls_cert is not None:
        argv += ["--tls-cert", spec.tls_cert, "--tls-key", str(spec.tls_key)]
    return argv


def router_argv(spec: ClusterSpec, worker_urls: Sequence[str], metrics_port: int) -> list[str]:
    """sglang-router over `worker_urls`, with health checks quick enough that a dead replica leaves the
    rotation within seconds, and its own graceful shutdown as long as the replicas'."""
    argv = [spec.python, "-m", "skippy.cluster._router_main", "--host", spec.host, "--port", str(spec.port),
            "--worker-urls", *worker_urls, "--policy", spec.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S), "--health-check-timeout-secs",
            str(HEALTH_TIMEOUT_S), "--health-failure-threshold", "1", "--health-success-threshold", "1",
            *RETRIES, *BREAKER, *(BALANCE if spec.policy == "cache_aware" else ()), "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", str(max(1, round(spec.shutdown_deadline))), "--log-level", "warn"]
    ca = spec.tls_ca or spec.tls_cert
    if ca is not None:
        argv += ["--ca-cert-paths", ca]
    return argv + list(spec.router_args)


def plan(spec: ClusterSpec, *, is_free: Callable[[str, int], bool] = port_free) -> ClusterPlan:
    """Ports, URLs and argv of everything `spec` starts."""
    check(spec)
    if not is_free(spec.host, spec.port):
        raise ClusterConfigError(f"the router's port {spec.port} is in use on {spec.host}: give --port")
    ports = pick_ports(spec.replicas, spec.port + 1, taken=[spec.port],
                       is_free=lambda p: is_free(spec.replica_host, p))
    tls = spec.tls_cert is not None
    replicas = tuple(Replica(i, p, url(spec.replica_host, p, tls), tuple(replica_argv(spec, p)))
                     for i, p in enumerate(ports))
    metrics = pick_ports(1, 29000, taken=[spec.port, *ports], is_free=lambda p: is_free("127.0.0.1", p))[0]
    urls = [r.url for r in replicas] + list(spec.worker_urls)
    return ClusterPlan(spec, replicas, url(spec.host if spec.host not in ("0.0.0.0", "::") else "127.0.0.1",
                                           spec.port), tuple(router_argv(spec, urls, metrics)), metrics)


def ready_line(p: ClusterPlan, model: str | None = None) -> str:
    """The one line `skippy cluster` prints once the router and every replica answer."""
    what = f"{model} " if model else ""
    return (f"skippy cluster: serving {what}on {p.router_url} ({p.spec.policy} router) over "
            f"{len(p.worker_urls)} replica(s): {', '.join(p.worker_urls)} (Ctrl-C to stop)")


def ready_json(p: ClusterPlan, model: str | None = None, pids: dict[str, int] | None = None,
               logs: str | None = None) -> str:
    """The same as one JSON line (--json), with each local replica's pid and where the logs are."""
    pids = pids or {}
    return json.dumps({
        "router": p.router_url, "policy": p.spec.policy, "model": model, "metrics": url("127.0.0.1", p.metrics_port),
        "replicas": [{"url": r.url, "pid": pids.get(r.url), "local": True} for r in p.replicas]
        + [{"url": u, "pid": None, "local": False} for u in p.spec.worker_urls],
        "router_pid": pids.get("router"), "logs": logs,
    })
