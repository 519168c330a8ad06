"""The goodput checks (bench/gate/goodput_checks.py) on hand-made goodput.json tables."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gate.goodput_checks import goodput_checks  # noqa: E402


def table(skippy: dict, peer: dict, shed: dict | None = None, caps=(1.2, 0.8), ttft=(900.0, 1000.0)) -> dict:
    """Rates 1.0 / 1.2 / 1.5 (capacity 1.0); goodput per rate for skippy and llama-server, one SLO;
    `ttft`: their p99 TTFT ms at every rate."""
    rows = {}
    for rate in ("1", "1.2", "1.5"):
        rows[rate] = {"skippy": {"fixed": {"goodput": skippy[rate], "failed": 0, "met": 0.9, "ttft_p99_ms": ttft[0]}},
                      "llama-server": {"fixed": {"goodput": peer[rate], "failed": 0, "met": 0.5,
                                                 "ttft_p99_ms": ttft[1]}}}
        if shed:
            rows[rate]["skippy-shed"] = {"fixed": {"goodput": shed[rate], "failed": 0, "met": 0.9}}
    closed = {f"N={n}": {"skippy": {"fixed": {"goodput": 0.5}}, "llama-server": {"fixed": {"goodput": 0.4}}}
              for n in (8, 32)}
    return {"capacity_req_s": 1.0, "slos": {"fixed": [2000, 200]}, "rates": rows, "closed": closed,
            "slo_capacity": {"skippy": {"fixed": caps[0]}, "llama-server": {"fixed": caps[1]}}}


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_clear_win_passes_every_check():
    checks = goodput_checks(table({"1": 0.9, "1.2": 0.9, "1.5": 0.85}, {"1": 0.6, "1.2": 0.4, "1.5": 0.2},
                                  shed={"1": 0.9, "1.2": 0.9, "1.5": 0.88}))
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert {"goodput@1x", "lead@1x", "lead@1.2x", "SLO capacity", "no collapse (skippy)",
            "no collapse (skippy-shed)", "p99 TTFT@1x", "goodput@N=8", "goodput@N=32"} <= set(by_name(checks))
    assert "p99 TTFT@1.2x" not in by_name(checks)  # past capacity only goodput is judged


def test_each_shortfall_fails_its_own_check():
    got = by_name(goodput_checks(table({"1": 0.9, "1.2": 0.7, "1.5": 0.6}, {"1": 0.8, "1.2": 0.4, "1.5": 0.7},
                                       caps=(1.0, 1.0))))
    assert not got["lead@1x"].passed  # 0.9 < 1.2 x 0.8
    assert got["lead@1.2x"].passed  # 0.7 >= 1.2 x 0.4
    assert not got["goodput@1.5x"].passed  # behind llama-server there
    assert not got["SLO capacity"].passed  # 1.0 < 1.3 x 1.0 on dense
    assert not got["no collapse (skippy)"].passed  # 0.6 < 0.8 x 0.9
    assert "no collapse (skippy-shed)" not in got  # no shed run: nothing judged


def test_other_classes_need_only_match_llama_servers_capacity_and_no_lead():
    got = by_name(goodput_checks(table({"1": 0.9, "1.2": 0.9, "1.5": 0.9}, {"1": 0.85, "1.2": 0.8, "1.5": 0.2},
                                       caps=(1.0, 1.0)), dense=False))
    assert got["SLO capacity"].passed and "lead@1x" not in got


def test_missing_figures_fail():
    t = table({"1": 0.9, "1.2": 0.9, "1.5": 0.9}, {"1": 0.5, "1.2": 0.5, "1.5": 0.5})
    del t["rates"]["1.5"]["llama-server"]
    t["rates"]["1.2"]["skippy"]["fixed"]["goodput"] = None
    got = goodput_checks(t)
    assert not all(c.passed for c in got)
    assert any(c.name == "goodput@1.2x" and not c.passed for c in got)


def test_p99_ttft_up_to_capacity_must_not_exceed_llama_servers():
    wins = {"1": 0.9, "1.2": 0.9, "1.5": 0.9}
    slower = by_name(goodput_checks(table(wins, {"1": 0.5, "1.2": 0.5, "1.5": 0.5}, ttft=(1001.0, 1000.0))))
    assert not slower["p99 TTFT@1x"].passed and slower["p99 TTFT@1x"].new == 1001.0
    assert slower["lead@1x"].passed  # goodput alone does not excuse a slower p99 TTFT
    t = table(wins, {"1": 0.5, "1.2": 0.5, "1.5": 0.5})
    del t["rates"]["1"]["llama-server"]["fixed"]["ttft_p99_ms"]
    assert not by_name(goodput_checks(t))["p99 TTFT@1x"].passed  # absent evidence fails


def test_closed_loop_goodput_is_judged_at_every_n():
    wins = {"1": 0.9, "1.2": 0.9, "1.5": 0.9}
    t = table(wins, {"1": 0.5, "1.2": 0.5, "1.5": 0.5})
    t["closed"]["N=8"]["llama-server"]["fixed"]["goodput"] = 0.6  # ahead of skippy's 0.5 at N=8
    got = by_name(goodput_checks(t))
    assert not got["goodput@N=8"].passed and got["goodput@N=32"].passed
    del t["closed"]["N=32"]["skippy"]
    assert not by_name(goodput_checks(t))["goodput@N=32"].passed  # absent evidence fails
    del t["closed"]
    assert not by_name(goodput_checks(t))["goodput@N (closed loop)"].passed  # no closed loop at all
