"""The stress harness's pure parts: the checks catch what they claim to, the workload is what it says."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stress import invariants as inv
from stress import report, tally
from stress.outcomes import (
    CLIENT_CANCELLED,
    COMPLETED,
    FAILED,
    HUNG,
    OVERLOADED,
    REJECTED,
    TIMED_OUT,
    Outcome,
)
from stress.workload import ENGINE_MALFORMED, SERVER_MALFORMED, Job, Shape, demand, make_round, pool_cells, server_malformed


def job(i: int, kind: str = "complete", max_tokens: int = 4) -> Job:
    return Job(id=f"r0-{i}", kind=kind, prompt=(300, 301, 302), max_tokens=max_tokens)


def completed(i: int, n: int = 4, max_tokens: int = 4, reason: str = "length") -> Outcome:
    return Outcome(f"r0-{i}", "complete", COMPLETED, reason, max_tokens=max_tokens, tokens=list(range(n)),
                   indices=list(range(n)), finals=1, completion_tokens=n)


# -- workload -----------------------------------------------------------------------------


def test_a_round_is_seeded_and_mixes_every_kind():
    shape = Shape(vocab=(260, 512))
    a, b = make_round(shape, 200, seed=3, round_no=1), make_round(shape, 200, seed=3, round_no=1)
    assert a == b and a != make_round(shape, 200, seed=3, round_no=2)
    assert {j.kind for j in a} == {"complete", "cancel", "disconnect", "timeout", "malformed"}
    assert len({j.id for j in a}) == 200
    assert all(260 <= t < 512 for j in a for t in j.prompt)
    assert {j.priority for j in a} >= {-1, 0, 1, 5}
    assert all(j.malformed for j in a if j.kind == "malformed")


def test_the_pool_is_a_quarter_of_the_demand_and_every_request_fits_it():
    shape = Shape(vocab=(260, 512))
    rounds = [make_round(shape, 256, seed=0, round_no=r) for r in range(3)]
    pool = pool_cells(rounds, demand_ratio=4.0)
    mean = sum(demand(r) for r in rounds) / 3
    assert 3.5 <= mean / pool <= 4.0
    assert all(j.demand <= pool for r in rounds for j in r)


@pytest.mark.parametrize("kind", SERVER_MALFORMED)
def test_every_server_malformation_is_refused_by_the_protocol_or_the_engine(kind):
    """Those the pure protocol layer refuses are checked here; the rest need the engine or the
    app (a prompt too long, a token outside the vocabulary, an unknown model)."""
    from skippy.server import protocol as P

    j = Job(id="r0-0", kind="malformed", prompt=(300, 301), max_tokens=4, malformed=kind)
    path, body, status = server_malformed(j, "m", n_ctx=256, n_vocab=512)
    if kind in ("prompt_too_long", "token_out_of_vocab", "unknown_model"):
        data = P.parse_completion(P.parse_json(body))
        assert (len(data.prompt) >= 256 or max(data.prompt) >= 512) if kind != "unknown_model" else data.model != "m"
        return
    with pytest.raises(P.ApiError) as info:
        data = P.parse_json(body)
        (P.parse_chat if path.endswith("chat/completions") else P.parse_completion)(data)
    assert info.value.status == status == 400
    assert info.value.body()["error"]["message"]


# -- invariants -----------------------------------------------------------------------------


def test_lost_duplicated_and_hung_requests_are_caught():
    jobs = [job(i) for i in range(3)]
    assert inv.one_outcome_per_request(jobs, [completed(0), completed(1), completed(2)]).ok
    assert not inv.one_outcome_per_request(jobs, [completed(0), completed(1)]).ok
    assert not inv.one_outcome_per_request(jobs, [completed(0), completed(1), completed(2), completed(2)]).ok
    hung = Outcome("r0-2", "complete", HUNG)
    check = inv.one_outcome_per_request(jobs, [completed(0), completed(1), hung])
    assert not check.ok and "r0-2" in check.detail


def test_a_decode_failure_or_a_5xx_is_caught():
    assert inv.no_decode_failure([completed(0)]).ok
    assert not inv.no_decode_failure([Outcome("r0-0", "complete", FAILED, "error")]).ok
    assert not inv.no_decode_failure([Outcome("r0-0", "complete", COMPLETED, http_status=500)]).ok


def test_each_kind_must_end_in_a_clear_way():
    jobs = [job(0), job(1, "cancel"), job(2, "timeout"), job(3, "malformed")]
    fine = [completed(0), Outcome("r0-1", "cancel", CLIENT_CANCELLED), Outcome("r0-2", "timeout", TIMED_OUT),
            Outcome("r0-3", "malformed", REJECTED, http_status=400, expected_status=400, error_body_ok=True)]
    assert inv.clear_outcomes(jobs, fine).ok
    assert inv.clear_outcomes(jobs, [Outcome("r0-0", "complete", OVERLOADED)] + fine[1:]).ok
    assert not inv.clear_outcomes(jobs, [Outcome("r0-0", "complete", TIMED_OUT)] + fine[1:]).ok
    no_body = Outcome("r0-3", "malformed", REJECTED, http_status=400, expected_status=400, error_body_ok=False)
    assert not inv.clear_outcomes(jobs, fine[:3] + [no_body]).ok
    wrong_status = Outcome("r0-3", "malformed", REJECTED, http_status=422, expected_status=400, error_body_ok=True)
    assert not inv.clear_outcomes(jobs, fine[:3] + [wrong_status]).ok


def test_malformed_event_streams_are_caught():
    assert inv.engine_streams_well_formed([completed(0), completed(1, n=2, reason="stop")]).ok
    gap = completed(0)
    gap.indices = [0, 1, 3, 4]
    two_finals = completed(1)
    two_finals.finals = 2
    after_final = completed(2)
    after_final.final_last = False
    short = completed(3, n=3, max_tokens=4, reason="length")
    usage = completed(4)
    usage.completion_tokens = 5
    for bad in (gap, two_finals, after_final, short, usage):
        assert not inv.engine_streams_well_formed([bad]).ok, bad


def test_malformed_sse_responses_are_caught():
    def sse(**kw):
        o = Outcome("r0-0", "complete", COMPLETED, "length", max_tokens=4, finals=1, done=1, completion_tokens=4,
                    chunks=4, response_ids=["cmpl-1"])
        for k, v in kw.items():
            setattr(o, k, v)
        return o

    assert inv.server_responses_well_formed([sse()]).ok
    for bad in (sse(finals=2), sse(done=2), sse(after_done=1), sse(completion_tokens=3), sse(completion_tokens=None),
                sse(response_ids=["a", "b"]), sse(chunks=5), sse(final_last=False)):
        assert not inv.server_responses_well_formed([bad]).ok, bad
    twice = sse()
    twice.job_id = "r0-1"
    assert not inv.server_responses_well_formed([sse(), twice]).ok  # one response id for two requests


def test_engine_and_server_accounting():
    assert inv.engine_accounting(5, 5, {"stop": 1, "length": 3, "cancelled": 1, "error": 0}).ok
    assert not inv.engine_accounting(5, 5, {"length": 4, "error": 1}).ok
    assert not inv.engine_accounting(5, 5, {"length": 4}).ok  # one never finished
    assert not inv.engine_accounting(5, 5, {"length": 6}).ok  # one finished twice
    assert inv.server_accounting(3, 2, 6, {"length": 4, "cancelled": 1, "error": 0}).ok
    assert not inv.server_accounting(3, 2, 6, {"length": 2}).ok  # a client saw more completions than the server made
    assert not inv.server_accounting(3, 2, 6, {"length": 6}).ok
    assert not inv.server_accounting(3, 2, 6, {"length": 3, "error": 1}).ok


def test_memory_must_be_idle():
    idle = inv.MemorySnapshot(running=0, waiting=0, attn_used=40, prefix_resident=40, lanes_holding=(),
                              live_requests=0)
    assert inv.memory_idle(idle).ok
    for bad in (
        inv.MemorySnapshot(running=1, waiting=0, attn_used=0, prefix_resident=0),
        inv.MemorySnapshot(running=0, waiting=2, attn_used=0, prefix_resident=0),
        inv.MemorySnapshot(running=0, waiting=0, attn_used=41, prefix_resident=40),
        inv.MemorySnapshot(running=0, waiting=0, attn_used=0, prefix_resident=0, lanes_holding=(3,)),
        inv.MemorySnapshot(running=0, waiting=0, attn_used=0, prefix_resident=0, live_requests=1),
    ):
        assert not inv.memory_idle(bad).ok, bad


def test_rss_growth_beyond_the_tolerance_fails():
    assert inv.rss_stable([100, 110, 112, 115], tolerance_mib=8, tolerance_pct=5).ok
    assert not inv.rss_stable([100, 110, 130, 150], tolerance_mib=8, tolerance_pct=5).ok
    assert inv.rss_stable([100, 400], tolerance_mib=8, tolerance_pct=5).ok  # too few rounds: not measured
    assert "not measured" in inv.rss_stable([100, 400], 8, 5).detail


def test_connections_kept_after_their_clients_left_are_caught():
    assert inv.connections_released(9, 12).ok
    assert not inv.connections_released(9, 40).ok
    assert not inv.connections_released(9, -1).ok  # not measurable: not a pass


def test_parity_needs_a_sample_and_equal_outputs():
    assert inv.solo_parity([inv.ParitySample("a", (1, 2), (1, 2))]).ok
    assert not inv.solo_parity([inv.ParitySample("a", (1, 2), (1, 3))]).ok
    assert not inv.solo_parity([]).ok


def test_the_greedy_sample_takes_completed_greedy_requests_only():
    outs = [completed(i) for i in range(6)]
    for o in outs[:4]:
        o.greedy = True
    outs[0].status = CLIENT_CANCELLED
    picked = tally.greedy_sample(outs, 10, np.random.default_rng(0))
    assert [o.job_id for o in picked] == ["r0-1", "r0-2", "r0-3"]
    assert len(tally.greedy_sample(outs, 2, np.random.default_rng(0))) == 2
    assert [o.job_id for o in tally.greedy_sample(outs, 10, np.random.default_rng(0), {"r0-2"})] == ["r0-2"]


def test_rounds_roll_up_into_one_line_per_invariant():
    checks = tally.per_round(1, [inv.Check("x", True, "a")]) + tally.per_round(2, [inv.Check("x", False, "b")])
    [rolled] = tally.roll_up(checks)
    assert rolled.name == "all rounds: x" and not rolled.ok and "round 2: b" in rolled.detail


def test_the_exit_status_and_the_printed_summary(capsys, tmp_path):
    ok = report.summary("engine", "cmd", {}, [inv.Check("a", True, "fine")], [], {"requests": 1})
    assert report.finish(ok) == 0
    bad = report.summary("engine", "cmd", {}, [inv.Check("a", True), inv.Check("b", False, "broken")], [],
                         {"requests": 1})
    assert report.finish(bad) == 1
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1])["failed"] == ["b"]
    assert "FAIL b: broken" in err and "PASS a" in err
    written = report.write({**bad, "rounds": [{"round": 1, "seconds": 1.0, "rss_mib": 50.0, "outcomes": {}}]},
                           tmp_path / "run")
    assert json.loads((written / "results.json").read_text())["ok"] is False
    assert "FAIL b: broken" in (written / "summary.md").read_text()


@pytest.mark.parametrize("kind", ENGINE_MALFORMED)
async def test_every_engine_malformation_raises_a_named_error(kind):
    import trio

    import skippy
    from skippy.testing import FakeRuntime, open_fake_engine
    from stress.workload import engine_malformed

    j = Job(id="r0-0", kind="malformed", prompt=(3, 4, 5), max_tokens=4, malformed=kind)
    with trio.fail_after(10):
        async with open_fake_engine(FakeRuntime(n_ctx=128, n_vocab=64)) as engine:
            args, kwargs = engine_malformed(j, engine.runtime.n_ctx, engine.runtime.n_vocab)
            with pytest.raises(skippy.InvalidInputError):
                engine.generate(*args, **kwargs)
            assert engine.stats().submitted == 0
