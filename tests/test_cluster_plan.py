"""skippy.cluster's pure parts: the spec's checks, the ports, each child's argv, the ready line; and
the command line (serve flags passed through, the one line without the extra). Nothing starts."""

from __future__ import annotations

import json

import pytest

from skippy import cli
from skippy.cluster import command
from skippy.cluster.plan import (ClusterConfigError, ClusterSpec, check, pick_ports, plan, ready_json, ready_line,
                                 replica_argv, router_argv)


def _all_free(host: str, port: int) -> bool:
    return True


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_replicas_take_the_next_free_ports_after_the_routers():
    busy = {8082}
    assert pick_ports(3, 8081, taken=[8080], is_free=lambda p: p not in busy) == [8081, 8083, 8084]
    p = plan(ClusterSpec(replicas=2, port=9000), is_free=lambda h, port: port != 9001)
    assert [r.port for r in p.replicas] == [9002, 9003]
    assert p.worker_urls == ("http://127.0.0.1:9002", "http://127.0.0.1:9003")
    assert p.router_url == "http://127.0.0.1:9000" and p.metrics_port not in (9000, 9002, 9003)


def test_a_busy_router_port_is_refused_before_anything_starts():
    with pytest.raises(ClusterConfigError, match="port 9000 is in use"):
        plan(ClusterSpec(replicas=1, port=9000), is_free=lambda h, port: port != 9000)


def test_replica_argv_passes_serve_flags_and_sets_its_own():
    spec = ClusterSpec(replicas=2, threads_per_replica=3, serve_args=("--family", "llama", "--n-ctx", "4096"),
                       shutdown_deadline=12, python="py")
    argv = replica_argv(spec, 8081)
    assert argv[:4] == ["py", "-m", "skippy", "serve"] and argv[4:8] == ["--family", "llama", "--n-ctx", "4096"]
    assert _flag(argv, "--port") == "8081" and _flag(argv, "--threads") == "3" and _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--shutdown-deadline") == "12" and "--tls-cert" not in argv
    assert "--api-key" not in argv  # the key travels in $SKIPPY_API_KEY, out of the process list
    tls = replica_argv(ClusterSpec(replicas=1, tls_cert="c.pem", tls_key="k.pem"), 8081)
    assert _flag(tls, "--tls-cert") == "c.pem" and _flag(tls, "--tls-key") == "k.pem"


def test_router_argv_routes_to_every_replica_with_quick_health_checks():
    spec = ClusterSpec(replicas=2, policy="round_robin", port=8080, worker_urls=("http://far:8000",),
                       router_args=("--cache-threshold=0.5",), python="py")
    p = plan(spec, is_free=_all_free)
    argv = list(p.router_argv)
    assert argv[:3] == ["py", "-m", "skippy.cluster._router_main"]
    urls = argv[argv.index("--worker-urls") + 1:argv.index("--policy")]
    assert urls == ["http://127.0.0.1:8081", "http://127.0.0.1:8082", "http://far:8000"]
    assert _flag(argv, "--policy") == "round_robin" and _flag(argv, "--port") == "8080"
    assert _flag(argv, "--health-failure-threshold") == "1" and int(_flag(argv, "--health-check-interval-secs")) <= 2
    assert _flag(argv, "--prometheus-port") == str(p.metrics_port)
    assert argv[-1] == "--cache-threshold=0.5"  # raw router flags last: they win
    assert "--ca-cert-paths" not in argv and "--balance-abs-threshold" not in argv
    tls = router_argv(ClusterSpec(replicas=1, tls_cert="c.pem", tls_key="k.pem"), ["https://127.0.0.1:8081"], 29000)
    assert _flag(tls, "--ca-cert-paths") == "c.pem"  # a self-signed certificate is its own CA
    ca = router_argv(ClusterSpec(replicas=1, tls_cert="c.pem", tls_key="k.pem", tls_ca="ca.pem"), [], 29000)
    assert _flag(ca, "--ca-cert-paths") == "ca.pem"
    assert plan(ClusterSpec(replicas=1, tls_cert="c", tls_key="k"), is_free=_all_free).replicas[0].url.startswith(
        "https://")


def test_cache_aware_balances_at_a_few_requests_apart_and_a_router_arg_still_wins():
    argv = router_argv(ClusterSpec(replicas=2), ["http://a", "http://b"], 29000)
    assert _flag(argv, "--policy") == "cache_aware" and _flag(argv, "--balance-abs-threshold") == "2"
    assert _flag(argv, "--balance-rel-threshold") == "1.5"
    mine = router_argv(ClusterSpec(replicas=2, router_args=("--balance-abs-threshold", "64")), ["http://a"], 29000)
    assert mine[-2:] == ["--balance-abs-threshold", "64"]  # after ours: argparse takes the last


@pytest.mark.parametrize("spec, match", [
    (ClusterSpec(replicas=-1), "must be >= 0"),
    (ClusterSpec(replicas=0), "nothing to route to"),
    (ClusterSpec(replicas=1, policy="power_of_two"), "at least 2"),
    (ClusterSpec(replicas=1, policy="fastest"), "--policy must be one of"),
    (ClusterSpec(replicas=1, threads_per_replica=0), "--threads-per-replica must be >= 1"),
    (ClusterSpec(replicas=1, serve_args=("--threads", "4")), "use --threads-per-replica"),
    (ClusterSpec(replicas=1, serve_args=("--port=9",)), "set by skippy cluster"),
    (ClusterSpec(replicas=0, worker_urls=("far:8000",)), "http:// or https://"),
    (ClusterSpec(replicas=1, tls_cert="c.pem"), "go together"),
    (ClusterSpec(replicas=1, tls_ca="ca.pem"), "--tls-ca is the CA"),
])
def test_what_cannot_run_is_refused_in_one_line(spec, match):
    with pytest.raises(ClusterConfigError, match=match):
        check(spec)


def test_power_of_two_counts_joined_replicas_too():
    check(ClusterSpec(replicas=1, policy="power_of_two", worker_urls=("http://far:8000",)))


def test_the_ready_line_and_its_json_name_the_router_and_every_replica():
    p = plan(ClusterSpec(replicas=2, port=8080, worker_urls=("http://far:8000",)), is_free=_all_free)
    line = ready_line(p, "llama-s0-v1")
    assert "\n" not in line and line.startswith("skippy cluster: serving llama-s0-v1 on http://127.0.0.1:8080")
    for u in ("http://127.0.0.1:8081", "http://127.0.0.1:8082", "http://far:8000"):
        assert u in line
    data = json.loads(ready_json(p, "llama-s0-v1", {"http://127.0.0.1:8081": 11, "router": 9}, "/tmp/logs"))
    assert data["router"] == "http://127.0.0.1:8080" and data["router_pid"] == 9 and data["policy"] == "cache_aware"
    assert [(r["url"], r["pid"], r["local"]) for r in data["replicas"]] == [
        ("http://127.0.0.1:8081", 11, True), ("http://127.0.0.1:8082", None, True), ("http://far:8000", None, False)]


def test_the_command_line_passes_unknown_flags_to_the_replicas_unabbreviated():
    parser = cli._parser()
    args, rest = parser.parse_known_args(["cluster", "--replicas", "3", "--model", "/m.gguf", "--threads", "2",
                                          "--n-ctx", "4096", "--policy", "round_robin"])
    assert args.replicas == 3 and args.policy == "round_robin" and args.threads_per_replica is None
    assert rest == ["--model", "/m.gguf", "--threads", "2", "--n-ctx", "4096"]  # --threads is serve's, kept whole
    spec = command.spec_of(args, ["--family", "llama"])
    assert spec.replicas == 3 and spec.serve_args == ("--family", "llama") and spec.threads_per_replica >= 1
    joined = command.spec_of(parser.parse_args(["cluster", "--worker-urls", "http://a:1", "http://b:2"]), [])
    assert joined.replicas == 0 and joined.worker_urls == ("http://a:1", "http://b:2")


def test_other_commands_still_refuse_unknown_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_without_the_extra_skippy_cluster_says_what_to_install_in_one_line(monkeypatch, capsys):
    real = command.importlib.util.find_spec
    monkeypatch.setattr(command.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang_router" else real(name, *a))
    assert cli.main(["cluster", "--replicas", "2", "--family", "llama"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"skippy: error: {command.INSTALL_HINT}"] and "pip install 'skippy[cluster]'" in err[0]


def test_a_bad_serve_flag_is_refused_by_skippy_serves_own_parser(capsys):
    with pytest.raises(SystemExit):
        cli.main(["cluster", "--replicas", "1", "--n-ctx", "lots"])
    assert "--n-ctx" in capsys.readouterr().err
