"""The `skippy cluster` command line: its own flags, the serve flags it passes to every replica,
and the check that the `cluster` extra is installed."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from .plan import POLICIES, ClusterConfigError, ClusterSpec

INSTALL_HINT = ("skippy cluster needs sglang-router: pip install 'skippy[cluster]' "
                "(in a checkout: ./bootstrap --cluster)")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """`skippy cluster`; any flag it does not know is a `skippy serve` flag for every replica."""
    # no abbreviations: `--threads` (a serve flag) must not be read as --threads-per-replica
    p = sub.add_parser("cluster", allow_abbrev=False,
                       help="K `skippy serve` replicas behind sglang-router (cache-aware routing, health checks, "
                            "restarts); any other serve flag (--model, --n-ctx, ...) goes to every replica")
    p.add_argument("--replicas", type=int, default=None,
                   help="local replicas to start (default: 2, or 0 with --worker-urls)")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware",
                   help="the router's policy (default: cache_aware: the replica with the longest matching prefix)")
    p.add_argument("--host", default="127.0.0.1", help="the router's bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8080, help="the router's port; replicas take the next free ports")
    p.add_argument("--replica-host", default="127.0.0.1", help="where local replicas listen (default: loopback)")
    p.add_argument("--threads-per-replica", type=int, default=None,
                   help="threads of each replica (default: this machine's CPUs split evenly)")
    p.add_argument("--worker-urls", nargs="+", default=[], metavar="URL",
                   help="replicas already running elsewhere (`skippy serve` on other hosts) to route to as well")
    p.add_argument("--json", action="store_true", help="also print the ready line as one JSON line on stdout")
    p.add_argument("--api-key", default=None,
                   help="the key clients give the router, and the router gives every replica (default: "
                        "$SKIPPY_API_KEY; passed to the children in their environment)")
    p.add_argument("--tls-cert", type=Path, default=None, metavar="PATH",
                   help="replicas serve HTTPS with this certificate (PEM, with --tls-key); the router checks it")
    p.add_argument("--tls-key", type=Path, default=None, metavar="PATH", help="the private key of --tls-cert")
    p.add_argument("--tls-ca", type=Path, default=None, metavar="PATH",
                   help="the CA the router trusts for replicas' certificates (default: --tls-cert itself)")
    p.add_argument("--shutdown-deadline", type=float, default=30.0,
                   help="seconds in-flight requests may take after Ctrl-C/SIGTERM (router and replicas)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds each replica may take to load")
    p.add_argument("--log-dir", type=Path, default=None, help="each child's log (default: a new temporary folder)")
    p.add_argument("--router-arg", action="append", default=[], metavar="FLAG",
                   help="a raw sglang-router flag, e.g. --router-arg=--cache-threshold=0.5 (repeatable; last wins)")
    return p


def require_extra() -> None:
    """One line saying what to install, before anything starts."""
    if importlib.util.find_spec("sglang_router") is None or importlib.util.find_spec("httpx") is None:
        raise ClusterConfigError(INSTALL_HINT)


def spec_of(args: argparse.Namespace, serve_args: Sequence[str]) -> ClusterSpec:
    worker_urls = tuple(args.worker_urls)
    replicas = args.replicas if args.replicas is not None else (0 if worker_urls else 2)
    threads = args.threads_per_replica or max(1, (os.cpu_count() or 1) // max(1, replicas))
    path = lambda p: None if p is None else str(p)  # noqa: E731
    return ClusterSpec(replicas=replicas, policy=args.policy, host=args.host, port=args.port,
                       replica_host=args.replica_host, threads_per_replica=threads, serve_args=tuple(serve_args),
                       worker_urls=worker_urls, tls_cert=path(args.tls_cert), tls_key=path(args.tls_key),
                       tls_ca=path(args.tls_ca), shutdown_deadline=args.shutdown_deadline,
                       router_args=tuple(args.router_arg))


def _model_first(serve: argparse.Namespace) -> None:
    """Fetch or write the model once, before K replicas would each race to."""
    from ..models import resolve_model

    resolve_model(serve.model, serve.family)


def run_command(args: argparse.Namespace, serve_args: Sequence[str], serve: argparse.Namespace) -> int:
    """`serve` is `serve_args` as `skippy serve` parses them (checked before anything starts)."""
    require_extra()
    from . import plan as P
    from .supervise import run

    spec = spec_of(args, serve_args)
    cluster = P.plan(spec)  # a bad request fails here, before any model is looked at
    api_key = args.api_key or os.environ.get("SKIPPY_API_KEY") or None
    if spec.replicas:
        _model_first(serve)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="skippy-cluster-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    def ready(sup: Any, model: str | None) -> None:
        print(f"{P.ready_line(cluster, model)}; logs in {log_dir}", file=sys.stderr, flush=True)
        if args.json:
            print(P.ready_json(cluster, model, sup.pids(), str(log_dir)), flush=True)

    import trio

    trio.run(lambda: run(cluster, log_dir, on_ready=ready, api_key=api_key, startup_timeout=args.startup_timeout))
    print("skippy cluster: stopped", file=sys.stderr, flush=True)
    return 0
