"""The engines' command lines, which engines a sweep runs by default, and the report's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gate.cli import _parser, sweep_options
from bench.gate.engines import ENGINES, QUICK_ENGINES, ServerConfig, Tools, server_argv
from bench.gate.model import ModelSpec

pytestmark = pytest.mark.bench

CFG = ServerConfig(ModelSpec(None, "llama", Path("/m.gguf")), threads=2, n_ctx=1024, n_batch=64,
                   skippy_extra=("--tpot-target-ms", "50"), llama_server_extra=("--cache-ram", "0"))
TOOLS = Tools(Path("/patched/bin"), Path("/stock/bin"))


def test_skippy_fast_is_skippy_without_batch_invariance():
    skippy, fast = (server_argv(e, CFG, 8000, 4, TOOLS) for e in ("skippy", "skippy-fast"))
    assert "--no-batch-invariant" in fast and "--no-batch-invariant" not in skippy
    assert [a for a in fast if a != "--no-batch-invariant"] == skippy
    for engine in ("skippy", "skippy-fast", "single-lane"):  # --skippy-args reach every skippy engine
        argv = server_argv(engine, CFG, 8000, 4, TOOLS)
        at = argv.index("--tpot-target-ms")
        assert argv[at + 1] == "50" and argv.index("--no-batch-invariant" if engine == "skippy-fast" else "serve") < at
    assert server_argv("single-lane", CFG, 8000, 4, TOOLS)[-2:] == ["--scheduler", "single-lane"]
    assert skippy[-2:] == fast[-2:] == ["--scheduler", "batched"]  # never left to the switch the gate judges


def test_stock_server_has_llama_servers_arguments_on_the_stock_binary():
    peer, stock = (server_argv(e, CFG, 8000, 4, TOOLS) for e in ("llama-server", "llama-server-stock"))
    assert peer[0] == "/patched/bin/llama-server" and stock[0] == "/stock/bin/llama-server"
    assert peer[1:] == stock[1:] and stock[-2:] == ["--cache-ram", "0"]
    with pytest.raises(ValueError, match="stock tools"):
        server_argv("llama-server-stock", CFG, 8000, 4, Tools(Path("/patched/bin")))
    assert server_argv("llama-server", CFG, 8000, 4, Path("/p"))[0] == "/p/llama-server"  # a bare dir still works


def _sweep(*argv: str):
    return sweep_options(_parser().parse_args(["sweep", *argv]))


def test_default_engines_full_and_quick():
    assert _sweep("--family", "llama").engines == ENGINES
    assert set(ENGINES) == {"skippy", "skippy-fast", "single-lane", "llama-server", "llama-server-stock"}
    assert _sweep("--quick").engines == QUICK_ENGINES == ("skippy", "single-lane", "llama-server")
    chosen = _sweep("--quick", "--engines", "skippy-fast", "llama-server-stock", "--skippy-args=--no-prefix-cache")
    assert chosen.engines == ("skippy-fast", "llama-server-stock")
    assert chosen.server.skippy_extra == ("--no-prefix-cache",)


def test_report_rows_for_new_engines_and_step_overhead():
    from bench.gate.metrics import Slo
    from bench.gate.records import Load, RequestRecord, RunResult
    from bench.gate.report import markdown

    req = RequestRecord(index=0, warmup=False, t_send=0.0, ttft=0.1, e2e=0.5, itl=[0.1] * 4, prompt_tokens=32,
                        output_tokens=5)
    runs = [RunResult("skippy-fast", "chat", Load.closed(1), 1.0, [req], {"step_overhead_ratio": 0.123}),
            RunResult("llama-server-stock", "chat", Load.closed(1), 1.0, [req], {})]
    meta = {"created": "now", "model": {"path": "/m.gguf"}, "server": {"threads": 2, "n_ctx": 1024, "n_batch": 64},
            "host": {"node": "h", "cpus": 2}, "run": {"warmup": 1}, "command": ["python"],
            "engines": ["skippy-fast", "llama-server-stock"], "workloads": []}
    text = markdown(meta, runs, [], Slo(1000.0))
    head = next(line for line in text.splitlines() if line.startswith("| load |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| N=1 |")}
    at = cols.index("step overhead")
    assert rows["skippy-fast"][at] == "0.12" and rows["llama-server-stock"][at] == "–"
    assert "skippy-fast = `skippy serve --no-batch-invariant`" in text
