"""The replica benchmark: its workload and summaries (pure), and a CI-sized run of the whole
script through `skippy cluster` with the real router (the committed run: bench/results/replicas)."""

from __future__ import annotations

import json

import pytest

from bench.replicas.__main__ import cells, main, parse
from bench.replicas.run import Cell
from bench.replicas.summary import calibrated_slo, done_checks, summarize_cell
from bench.replicas.workload import make_script, messages

pytestmark = pytest.mark.bench


def test_the_script_is_seeded_and_a_tenth_of_it_one_shots():
    a, b = make_script(40, seed=3), make_script(40, seed=3)
    assert a == b and a != make_script(40, seed=4)
    turns = [r for s in a.sessions for r in s if not r.one_shot]
    assert all(4 <= len(s) - sum(r.one_shot for r in s) <= 6 for s in a.sessions)
    assert a.one_shots / a.requests == pytest.approx(0.1, abs=0.01)
    for s in a.sessions:  # turns keep their order around the one-shots put among them
        assert [r.turn for r in s if not r.one_shot] == list(range(1, len(s) - sum(r.one_shot for r in s) + 1))
    assert len({r.user.split()[0:4].__repr__() for r in turns}) > 1
    with pytest.raises(ValueError):
        make_script(0)
    with pytest.raises(ValueError):
        make_script(4, one_shot_share=1.0)


def test_a_turns_messages_carry_the_system_prompt_and_the_whole_history():
    script = make_script(2, turns=(3, 3), one_shot_share=0.0)
    first, second, third = script.sessions[0]
    assert messages(script, first, []) == [{"role": "system", "content": script.system},
                                           {"role": "user", "content": first.user}]
    grown = messages(script, third, [(first.user, "A1"), (second.user, "A2")])
    assert [m["role"] for m in grown] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert grown[:2] == messages(script, first, [])  # each turn begins with the one before it
    one = make_script(30, one_shot_share=0.5).sessions
    shot = next(r for s in one for r in s if r.one_shot)
    assert messages(script, shot, [("x", "y")]) == [{"role": "user", "content": shot.user}]


def test_cells_interleave_policies_and_alternate_rounds():
    args = parse(["--sessions", "8", "--replicas", "1", "2", "--policies", "cache_aware", "round_robin",
                  "--rounds", "2"])
    keys = [c.key for c in cells(args)]
    assert keys == ["s8-k1-cache_aware-r0", "s8-k2-cache_aware-r0", "s8-k2-round_robin-r0",
                    "s8-k2-round_robin-r1", "s8-k2-cache_aware-r1", "s8-k1-cache_aware-r1"]


def _rec(ttft: float, e2e: float, turn: int, tokens: int = 5, error=None) -> dict:
    return {"index": 0, "warmup": False, "t_send": 0.0, "ttft": ttft, "e2e": e2e, "itl": [], "prompt_tokens": 100,
            "output_tokens": tokens, "cached_tokens": 0, "error": error, "session": 0, "turn": turn}


def _cell(replicas: int, policy: str, hits: float, ttft: float, rnd: int = 0) -> dict:
    urls = [f"http://r{i}" for i in range(replicas)]
    return {"key": Cell(8, replicas, policy, rnd).key, "cell": {"sessions": 8, "replicas": replicas, "policy": policy,
                                                                "round": rnd},
            "wall_s": 10.0, "replicas": {u: {"prefix_queries": 1000 / replicas, "prefix_hits": hits * 1000 / replicas,
                                             "prefilled": 10, "preemptions": 0} for u in urls},
            "router_before": {"smg_worker_cb_outcomes_total": [({"worker": urls[0], "outcome": "success"}, 2.0)]},
            "router_after": {"smg_worker_cb_outcomes_total": [({"worker": u, "outcome": "success"}, 5.0) for u in urls]},
            "records": [_rec(ttft, ttft + 0.4, 1), _rec(ttft, ttft + 0.4, 2), _rec(None, None, 2, 0, "HTTP 500: x")]}


def test_a_cell_summary_reads_the_replicas_counters_and_the_routers():
    slo = calibrated_slo({"records": [_rec(0.1, 0.5, 1), _rec(0.3, 0.7, 2)]})
    assert (slo.ttft_ms, slo.tpot_ms) == pytest.approx((2000.0, 500.0))  # 10 x 200 ms, 5 x 100 ms
    s = summarize_cell(_cell(2, "cache_aware", 0.8, 1.0), slo)
    assert s.hit_rate == pytest.approx(0.8) and s.prefilled == 20 and s.errors == 1 and s.requests == 3
    assert s.routed == {"http://r0": 3.0, "http://r1": 5.0}  # the phase's own delta
    assert s.ttft_p50_ms == pytest.approx(1000) and s.followup_ttft_p50_ms == pytest.approx(1000)
    assert s.goodput == pytest.approx(0.2) and s.throughput == pytest.approx(0.2)
    late = summarize_cell(_cell(2, "cache_aware", 0.8, 2.5), slo)
    assert late.goodput == 0.0


def test_the_done_checks_compare_at_the_most_replicas():
    rows = [summarize_cell(c, None) for c in (_cell(1, "cache_aware", 0.8, 1.0), _cell(4, "cache_aware", 0.75, 1.0),
                                              _cell(4, "round_robin", 0.3, 2.5), _cell(2, "round_robin", 0.1, 9.0))]
    hit, ttft = done_checks(rows)
    assert hit.value == pytest.approx(0.75 / 0.8) and hit.passed
    assert ttft.value == pytest.approx(0.4) and ttft.passed
    rows[1] = summarize_cell(_cell(4, "cache_aware", 0.7, 1.5), None)
    hit, ttft = done_checks(rows)
    assert not hit.passed and not ttft.passed  # 0.875x; 0.6x


@pytest.mark.cluster
def test_a_ci_sized_run_writes_every_cell_and_resumes(synth_model_path, tmp_path):
    pytest.importorskip("sglang_router", reason="the run goes through the real sglang-router: "
                                                "pip install 'skippy[cluster]' (./bootstrap --dev installs it)")
    synth_model_path("llama")
    argv = ["--family", "llama", "--sessions", "3", "--replicas", "1", "2", "--policies", "cache_aware", "round_robin",
            "--turns", "2", "2", "--system-words", "30", "--user-words", "6", "--gen", "4", "--think-s", "0.05",
            "--ramp-s", "0.2", "--n-ctx", "1024", "--prefix-slots", "4", "--out", str(tmp_path)]
    assert main(argv) == 0
    keys = sorted(p.stem for p in (tmp_path / "cells").glob("*.json"))
    assert keys == ["calibration", "s3-k1-cache_aware-r0", "s3-k2-cache_aware-r0", "s3-k2-round_robin-r0"]
    result = json.loads((tmp_path / "results.json").read_text())
    rows = {r["key"]: r for r in result["rows"]}
    assert all(r["errors"] == 0 and r["requests"] >= 6 for r in rows.values())
    assert all(r["hit_rate"] > 0 for r in rows.values())  # the shared system prompt at least
    assert sum(rows["s3-k2-round_robin-r0"]["routed"].values()) == rows["s3-k2-round_robin-r0"]["requests"]
    assert len(result["checks"]) == 2 and "Done-when checks" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "plots.png").stat().st_size > 0
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").glob("*.json")}
    assert main(argv) == 0  # resumes: every cell is there, nothing runs again
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").glob("*.json")} == before
