"""The gate's verdicts on hand-made summaries: pass, each kind of shortfall, absent evidence."""

from __future__ import annotations

import attrs
import pytest

from bench.gate.gate import Thresholds, gate, render
from bench.gate.metrics import Summary

pytestmark = pytest.mark.bench


def summ(tok: float, goodput: float | None = 1.0, ttft_p99: float = 100.0, failed: int = 0) -> Summary:
    return Summary(completed=10, failed=failed, duration_s=1.0, req_per_s=1.0, out_tok_per_s=tok, in_tok_per_s=1.0,
                   goodput=goodput, ttft_p50_ms=50.0, ttft_p99_ms=ttft_p99, ttft_mean_ms=60.0, tpot_p50_ms=10.0,
                   tpot_p99_ms=20.0, itl_p50_ms=10.0, itl_p99_ms=20.0, e2e_p50_ms=500.0, e2e_p99_ms=900.0,
                   cached_token_ratio=None)


def results(new: dict[int, Summary], old: dict[int, Summary], workload: str = "chat"):
    runs = {("skippy", workload, "closed", float(n)): s for n, s in new.items()}
    runs.update({("single-lane", workload, "closed", float(n)): s for n, s in old.items()})
    return runs


TH = {"single-lane": Thresholds(throughput_ratio=2.0, goodput_ratio=1.0, p99_ttft_slack=0.0, n1_tolerance=0.05)}


def verdicts(runs) -> dict[str, bool]:
    return {c.name: c.passed for c in gate(runs, 32, TH)}


def test_new_that_scales_passes():
    runs = results({1: summ(96), 32: summ(300, goodput=2.0, ttft_p99=90)},
                   {1: summ(100), 32: summ(100, goodput=1.0, ttft_p99=100)})
    got = verdicts(runs)
    assert got == {"throughput@N=32": True, "goodput@N=32": True, "p99 TTFT@N=32": True, "N=1 no regression": True,
                   "curve dominates": True, "no failed requests": True}
    assert "single-lane: PASS (6/6 checks)" in render(gate(runs, 32, TH))


def test_each_shortfall_fails_its_own_check():
    old = {1: summ(100), 32: summ(100, goodput=1.0, ttft_p99=100)}
    assert not verdicts(results({1: summ(100), 32: summ(199, goodput=2)}, old))["throughput@N=32"]  # < 2x
    assert not verdicts(results({1: summ(100), 32: summ(300, goodput=0.5)}, old))["goodput@N=32"]
    assert not verdicts(results({1: summ(100), 32: summ(300, ttft_p99=101)}, old))["p99 TTFT@N=32"]
    got = verdicts(results({1: summ(94), 32: summ(300)}, old))  # 6% slower alone
    assert not got["N=1 no regression"] and not got["curve dominates"]
    assert not verdicts(results({1: summ(100), 32: summ(300, failed=1)}, old))["no failed requests"]


def test_curve_must_dominate_at_every_n():
    old = {1: summ(100), 8: summ(100), 32: summ(100)}
    got = gate(results({1: summ(100), 8: summ(90), 32: summ(300)}, old), 32, TH)
    curve = next(c for c in got if c.name == "curve dominates")
    assert not curve.passed and "N=8" in curve.requirement and (curve.new, curve.ref) == (90, 100)


def test_absent_evidence_fails():
    got = verdicts(results({1: summ(100)}, {1: summ(100)}))  # N=32 never swept
    assert not got["throughput@N=32"] and not got["goodput@N=32"] and not got["p99 TTFT@N=32"]
    no_slo = verdicts(results({1: summ(100), 32: summ(300, goodput=None)}, {1: summ(100), 32: summ(100, goodput=None)}))
    assert not no_slo["goodput@N=32"]
    assert gate({("skippy", "chat", "closed", 1.0): summ(1)}, 32, TH) == []  # no reference engine: nothing to judge
    assert "no engine pair" in render([])


def test_checks_are_per_workload_and_only_closed_loop():
    runs = {**results({1: summ(100), 32: summ(300)}, {1: summ(100), 32: summ(100)}, "chat"),
            **results({1: summ(100), 32: summ(150)}, {1: summ(100), 32: summ(100)}, "rag"),
            ("skippy", "chat", "poisson", 4.0): attrs.evolve(summ(1), failed=3)}
    by = {(c.workload, c.name): c.passed for c in gate(runs, 32, TH)}
    assert by[("chat", "throughput@N=32")] and not by[("rag", "throughput@N=32")]
    assert by[("chat", "no failed requests")]  # the Poisson run's failures are not a closed-loop check
    assert {w for w, _ in by} == {"chat", "rag"}
    assert {c.workload for c in gate(runs, 32, TH, workloads=["rag"])} == {"rag"}


def test_pairs_judge_skippy_fast_and_the_stock_server():
    peer = Thresholds(throughput_ratio=1.0, goodput_ratio=1.0)
    th = {**TH, "llama-server": peer, "llama-server-stock": peer}
    runs = {(e, "chat", "closed", float(n)): summ(tok) for e, tok in
            (("skippy", 100), ("skippy-fast", 120), ("llama-server", 110), ("llama-server-stock", 105))
            for n in (1, 32)}
    checks = gate(runs, 32, th)
    by_pair = {(c.engine, c.reference) for c in checks}
    # single-lane absent: not judged; skippy-fast is judged against the llama-servers only
    assert by_pair == {("skippy", "llama-server"), ("skippy", "llama-server-stock"),
                       ("skippy-fast", "llama-server"), ("skippy-fast", "llama-server-stock")}
    passed = {pair: all(c.passed for c in checks if (c.engine, c.reference) == pair) for pair in by_pair}
    assert passed == {("skippy", "llama-server"): False, ("skippy", "llama-server-stock"): False,
                      ("skippy-fast", "llama-server"): True, ("skippy-fast", "llama-server-stock"): True}
    text = render(checks)
    assert "== skippy-fast vs llama-server-stock: PASS (6/6 checks)" in text
    assert "== skippy vs llama-server: FAIL" in text
    # a reference without thresholds is not judged
    assert {c.reference for c in gate(runs, 32, {"llama-server": peer})} == {"llama-server"}


def test_sampling_fields_go_over_the_greedy_body_and_the_report_says_so():
    from bench.gate.report import _sampling_text
    from bench.gate.runner import RunConfig, request_body

    greedy = RunConfig(seed=7)
    assert request_body("m", [1, 2], 8, greedy, 3)["temperature"] == 0.0
    assert _sampling_text(attrs.asdict(greedy)) == "greedy (temperature 0) in every engine"
    sampled = RunConfig(seed=7, sampling={"temperature": 1.0, "top_k": 0})
    body = request_body("m", [1, 2], 8, sampled, 3)
    assert (body["temperature"], body["top_k"], body["seed"], body["prompt"]) == (1.0, 0, 10, [1, 2])
    assert _sampling_text(attrs.asdict(sampled)) == "every request sends temperature 1.0, top_k 0 (and its seed)"


def test_the_p99_ttft_rule_trades_up_to_1_3x_for_itl_p99_within_a_quarter():
    old = {1: summ(100), 32: summ(100, ttft_p99=100)}

    def p99_ok(ttft: float, itl: float) -> bool:
        new = {1: summ(100), 32: attrs.evolve(summ(300, ttft_p99=ttft), itl_p99_ms=itl)}
        return verdicts(results(new, old))["p99 TTFT@N=32"]

    assert p99_ok(100, 20) and not p99_ok(101, 20)  # no smoother than the reference's 20 ms: <= 1x
    assert p99_ok(129, 5) and not p99_ok(131, 5)  # ITL p99 a quarter of it: up to 1.3x
    assert not p99_ok(120, 5.1)  # just past the quarter: back to 1x
    check = next(c for c in gate(results({1: summ(100), 32: summ(300)}, old), 32, TH) if c.name.startswith("p99"))
    assert "1.3 x while ITL p99 <= 0.25 x" in check.requirement and "ITL p99 20 vs 20 ms" in check.requirement


def test_the_2x_row_scales_with_the_measured_headroom_and_says_so():
    from bench.gate.headroom import headroom, headrooms

    entry = {"pp": 128, "tg": 64, "argv": ["llama-batched-bench", "-npl", "1,32"],
             "rows": [{"pl": 1, "speed": 200.0}, {"pl": 32, "speed": 300.0}]}
    h = headroom([{"pp": 1024, "tg": 64, "rows": []}, entry], 128, 64, 32)
    assert h.h == pytest.approx(1.5) and h.command == "llama-batched-bench -npl 1,32"
    assert headroom([entry], 128, 64, 64) is None and headroom([entry], 512, 64, 32) is None  # no such row / entry
    meta = {"workloads": [{"name": "chat", "input_len": 128, "output_len": 64}]}
    assert set(headrooms(meta, [entry], 32)) == {"chat"}
    old = {1: summ(100), 32: summ(100)}
    runs = results({1: summ(100), 32: summ(140)}, old)  # 1.4x single-lane
    plain = {c.name: c for c in gate(runs, 32, TH)}
    scaled = {c.name: c for c in gate(runs, 32, TH, headrooms={"chat": h})}
    assert not plain["throughput@N=32"].passed and scaled["throughput@N=32"].passed  # needs min(2, 0.9 x 1.5)
    assert "H = 1.50" in scaled["throughput@N=32"].requirement and "-npl 1,32" in scaled["throughput@N=32"].requirement
    big = headroom([{**entry, "rows": [{"pl": 1, "speed": 100.0}, {"pl": 32, "speed": 900.0}]}], 128, 64, 32)
    assert not {c.name: c for c in gate(runs, 32, TH, headrooms={"chat": big})}["throughput@N=32"].passed  # GPU: 2x
