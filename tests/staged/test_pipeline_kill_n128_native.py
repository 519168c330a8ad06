"""A `skippy stage` process SIGKILLed mid-run under N=128 concurrent sessions (#22).

2 stages (stage 1 a process), and 3 stages with either the middle or the last stage a process
that is killed while the other later stage runs in this process (`serve_stage`, what `skippy
stage` runs), so its KV cells can be read after the kill. The tiny synthetic llama; every
request greedy, so a completion must equal its solo run (the engine is batch-invariant).

Wave 1: 128 sessions at once (32 lanes: 32 running, 96 waiting); when a quarter have ended the
stage process is SIGKILLed. Pinned:
- every request ends exactly once, under a deadline, with the stage still down (nothing waits
  on a dead stage): completed with its solo tokens, or failed with a StepFailedError caused by
  a StageUnavailableError; a well-formed stream (contiguous indices, one final event, nothing
  after it); a failed request's tokens are a prefix of its solo run;
- the requests running at the kill complete or fail; the requests still waiting at the kill
  (never admitted: nothing of theirs is below stage 0) fail fast, once, with no token and the
  same named error. That is the engine's contract while a stage is down (a new request fails
  fast, clearly: test_pipeline_faults_native.py): a restart can take a model load's time or
  never come, so holding the queue would turn a dead stage into hanging clients, while a
  token-less StageUnavailableError tells a client that nothing was generated and a retry is safe;
- nothing leaks: stage 0 back to idle (no running/waiting request, no live record, no KV cell,
  no request still held below stage 0 in the pipeline runtime's books) and the surviving
  stage's KV cells all freed once its session ended;
- a new request while the stage is down fails fast with the same error; after the stage is
  restarted on its port, wave 2 (128 new sessions) is served in full, each equal to its solo
  run, over exactly one new pipeline session; then everything is idle again.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import trio

from skippy.errors import StageUnavailableError, StepFailedError
from skippy.kv import ComponentKind
from skippy.scheduling.requests import RequestState
from skippy.staged import PINNED_SPLITS
from skippy.staged._launch import StageProcess, stage_argv
from skippy.staged._pipeline import open_pipeline, parse_addr
from skippy.staged._stage import StageRuntime, serve_stage

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the stress harness lives at the repository root (see tests/stress/conftest.py)
    sys.path.insert(0, str(REPO))

from stress import invariants as inv
from stress.engine_run import _record
from stress.outcomes import COMPLETED, FAILED, Outcome
from stress.reference import SoloReference
from stress.workload import Job

pytestmark = [pytest.mark.staged, pytest.mark.native]

N = 128
MAX_TOKENS = 16  # each request 4..16: their ends are staggered, so the kill finds them at every stage
N_CTX, N_BATCH, FLOOR = 2048, 64, 64  # 32 lanes per stage: a quarter of the sessions run at once
OPTIONS = ["--n-ctx", str(N_CTX), "--n-batch", str(N_BATCH), "--threads", "1", "--floor-ctx", str(FLOOR)]
# admission by memory alone: the kill must find requests in flight with tokens, at N=128 (the latency targets
# would hold most of them back, and when depends on the first steps: a pipeline has no probe at open)
CONFIG = {"n_ctx": N_CTX, "n_batch": N_BATCH, "threads": 1, "floor_ctx_per_session": FLOOR, "slo_scheduling": False}

# (stages, the stage that is a process and is killed, the surviving later stage served in this process)
CASES = {"2-stages": (2, 1, None), "3-stages-last-killed": (3, 2, 1), "3-stages-middle-killed": (3, 1, 2)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jobs(wave: int, n: int, vocab: tuple[int, int] = (260, 460)) -> list[Job]:
    rng = np.random.default_rng([22, wave])
    return [Job(f"w{wave}-{i}", "complete", tuple(rng.integers(*vocab, size=int(rng.integers(3, 24))).tolist()),
                int(rng.integers(4, MAX_TOKENS + 1))) for i in range(n)]


class _Stages:
    """Stages 1..K-1: the killed one a `skippy stage` process on a fixed port (it comes back on it),
    the surviving one (3 stages) served here."""

    def __init__(self, argv: list[str], proc: StageProcess) -> None:
        self.argv, self.proc = argv, proc
        self.survivor: StageRuntime | None = None
        self.freed = 0  # sequences the surviving stage removed (Releases and session ends)

    def watch(self, survivor: StageRuntime | None) -> None:
        self.survivor = survivor
        if survivor is not None:
            seq_rm = survivor.seq_rm

            def counted(seq: int) -> None:
                self.freed += 1
                seq_rm(seq)

            survivor.seq_rm = counted

    def kill(self) -> None:
        os.kill(self.proc.proc.pid, signal.SIGKILL)

    async def restart(self) -> float:
        self.proc.proc.wait()
        t0 = time.perf_counter()
        self.proc = await trio.to_thread.run_sync(StageProcess, self.argv)
        return time.perf_counter() - t0

    def survivor_cells(self) -> tuple[int, list[int]]:
        """(cells in use, lanes still holding a cell) in the stage served here."""
        if self.survivor is None:
            return 0, []
        rt = self.survivor
        used = sum(rt.ctx.ledger().used.values())
        return used, [s for s in range(rt.lanes) if rt.ctx.seq_pos_max(s) != -1]


@asynccontextmanager
async def _stages(path, n_stages: int, killed: int, survivor: int | None):
    splits = PINNED_SPLITS["llama"][n_stages]
    port = _free_port()
    runtime = stages = None
    try:
        async with trio.open_nursery() as nursery:
            next_addr: str | None = None
            for i in range(n_stages - 1, 0, -1):  # the last first: each needs its next's address
                if i == killed:
                    argv = stage_argv(path, splits[i], f"127.0.0.1:{port}", next_addr, OPTIONS)
                    stages = _Stages(argv, await trio.to_thread.run_sync(StageProcess, argv))
                    next_addr = stages.proc.addr
                else:
                    assert i == survivor
                    runtime = StageRuntime(path, splits[i], n_ctx=N_CTX, n_batch=N_BATCH, threads=1,
                                           floor_ctx_per_session=FLOOR)
                    bound = await nursery.start(serve_stage, runtime, "127.0.0.1", 0,
                                                parse_addr(next_addr) if next_addr else None)
                    next_addr = f"127.0.0.1:{bound}"
            assert stages is not None
            stages.watch(runtime)
            yield splits, parse_addr(next_addr), stages
            nursery.cancel_scope.cancel()
    finally:
        if stages is not None:
            stages.proc.kill()  # the one running now: the restarted process, after a restart
        if runtime is not None:
            runtime.close()


class _Wave:
    """N sessions at once; with `kill`, the stage is killed when a quarter have ended."""

    def __init__(self, engine, jobs: list[Job], kill=None) -> None:
        self.engine, self.jobs, self.kill = engine, jobs, kill
        self.outcomes: dict[str, Outcome] = {}
        self.errors: dict[str, BaseException] = {}
        self.streams: dict[str, object] = {}
        self.at_kill: dict[str, RequestState] = {}
        self.t_kill: float | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for job in self.jobs:
                nursery.start_soon(self._one, job)

    async def _one(self, job: Job) -> None:
        o = Outcome(job.id, job.kind, max_tokens=job.max_tokens, greedy=True)
        t0 = time.perf_counter()
        stream = self.engine.generate(list(job.prompt), max_tokens=job.max_tokens)
        self.streams[job.id] = stream
        async for event in stream:
            _record(o, event, t0)
            if event.final:
                if event.error is not None:
                    self.errors[job.id] = event.error
                self.outcomes[job.id] = o
                self._maybe_kill()

    def _maybe_kill(self) -> None:
        if self.kill is None or self.t_kill is not None or len(self.outcomes) < len(self.jobs) // 4:
            return
        self.at_kill = {jid: s.request.state for jid, s in self.streams.items()}
        self.kill()
        self.t_kill = time.perf_counter()


def _idle(engine) -> inv.MemorySnapshot:
    s = engine.stats()
    local = engine.runtime.local
    attn = local.ledger().get(ComponentKind.ATTN)
    holding = tuple(q for q in range(engine.lanes.ceiling) if local.ctx.seq_pos_max(q) != -1)
    return inv.MemorySnapshot(running=s.running, waiting=s.waiting, attn_used=attn.used if attn else 0,
                              prefix_resident=0, lanes_holding=holding, live_requests=engine.live)


async def _settle(engine, stages: _Stages) -> None:
    """Stage 0 idle, nothing held below it in its books, the surviving stage's cells all freed
    (its Releases and session ends are asynchronous: polled, under a deadline)."""
    with trio.move_on_after(10):  # past it, the checks below say what stuck
        await engine.settled()
        while not inv.memory_idle(_idle(engine)).ok or stages.survivor_cells() != (0, []):
            await trio.sleep(0.02)
    check = inv.memory_idle(_idle(engine))
    assert check.ok, check.line()
    assert engine.runtime._held == {} and engine.runtime._chunks == {}, (
        f"requests still held below stage 0: {engine.runtime._held}")
    used, holding = stages.survivor_cells()
    assert (used, holding) == (0, []), f"the surviving stage holds {used} cells, in lanes {holding}"


def _named(error: BaseException | None) -> str:
    """The StageUnavailableError under a StepFailedError, as text (asserts the shape)."""
    assert isinstance(error, StepFailedError), repr(error)
    cause = error.__cause__
    assert isinstance(cause, StageUnavailableError), repr(cause)
    text = str(cause)
    assert any(w in text for w in ("gone", "unreachable", "closed the connection")), text
    return text


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_a_stage_sigkilled_at_n128_ends_every_request_once_and_the_pipeline_serves_again(
        case, synth_model_path, capsys):
    n_stages, killed, survivor = CASES[case]
    path = synth_model_path("llama", deep=True)
    wave1, wave2, down = _jobs(1, N), _jobs(2, N), _jobs(3, 8)
    with SoloReference(path, 64) as ref:
        solo = {j.id: ref.tokens(j.prompt, j.max_tokens) for j in wave1 + wave2}

    with trio.fail_after(120):
        async with _stages(path, n_stages, killed, survivor) as (splits, first, stages):
            async with open_pipeline(path, splits[0][1], first, **CONFIG) as engine:
                assert engine.pipeline.n_stages == n_stages and engine.lanes.ceiling == 32

                # -- wave 1: the kill, mid-run; every request ends while the stage is still down
                freed_at_kill = []

                def kill() -> None:
                    freed_at_kill.append(stages.freed)
                    stages.kill()

                w1 = _Wave(engine, wave1, kill=kill)
                with trio.move_on_after(30):  # a request still open then is reported as missing below
                    await w1.run()
                t_ended = time.perf_counter()
                assert w1.t_kill is not None and t_ended - w1.t_kill < 10, "wave 1 ends fast, the stage down"
                assert stages.proc.proc.poll() is not None, "the stage is down throughout wave 1's end"
                outcomes = list(w1.outcomes.values())
                for check in (inv.one_outcome_per_request(wave1, outcomes), inv.engine_streams_well_formed(outcomes)):
                    assert check.ok, check.line()
                ended_before = {jid for jid, st in w1.at_kill.items() if st is RequestState.FINISHED}
                running = {jid for jid, st in w1.at_kill.items() if st is RequestState.RUNNING}
                waiting = {jid for jid, st in w1.at_kill.items() if st in (RequestState.WAITING, RequestState.NEW)}
                assert len(ended_before | running | waiting) == N
                assert running and waiting, w1.at_kill  # mid-run: some in flight, some still queued
                completed = {o.job_id for o in outcomes if o.status == COMPLETED}
                failed = {o.job_id for o in outcomes if o.status == FAILED}
                assert completed | failed == {j.id for j in wave1}
                parity = inv.solo_parity([inv.ParitySample(j, tuple(w1.outcomes[j].tokens), tuple(solo[j]))
                                          for j in completed])
                assert parity.ok, parity.line()
                assert ended_before <= completed  # what had finished at the kill completed
                for jid in failed:  # the named error; what a failed request got before it was right
                    _named(w1.errors[jid])
                    got = w1.outcomes[jid].tokens
                    assert got == solo[jid][:len(got)], jid
                # the waiting ones never reached the dead stage: failed once, fast, with no token
                for jid in waiting:
                    assert w1.outcomes[jid].status == FAILED and w1.outcomes[jid].tokens == [], jid
                assert running & failed, "some of the requests in flight failed"
                finished = engine.stats().finished
                assert (finished["stop"] + finished["length"], finished["error"]) == (len(completed), len(failed))
                await _settle(engine, stages)
                # the surviving stage held the state of the requests in flight, and its session's end freed it
                had_state = {j for j in running & failed if w1.outcomes[j].tokens}
                if survivor is not None:
                    assert stages.freed - freed_at_kill[0] >= len(had_state) > 0

                # -- while it is down a new request fails fast, clearly, and touches nothing
                for job in down:
                    with trio.fail_after(10):
                        events = [e async for e in engine.generate(list(job.prompt), max_tokens=job.max_tokens)]
                    assert [e.final for e in events] == [True] and events[0].finish_reason == "error"
                    assert "unreachable" in _named(events[0].error)

                # -- back on its port: wave 2 is served in full, each equal to its solo run
                t_restart = await stages.restart()
                w2 = _Wave(engine, wave2)
                t0 = time.perf_counter()
                with trio.move_on_after(60):
                    await w2.run()
                t_wave2 = time.perf_counter() - t0
                outcomes2 = list(w2.outcomes.values())
                for check in (inv.one_outcome_per_request(wave2, outcomes2), inv.engine_streams_well_formed(outcomes2),
                              inv.no_decode_failure(outcomes2), inv.clear_outcomes(wave2, outcomes2),
                              inv.solo_parity([inv.ParitySample(o.job_id, tuple(o.tokens), tuple(solo[o.job_id]))
                                               for o in outcomes2])):
                    assert check.ok, check.line()
                assert engine.runtime.link.session.epoch == 2  # one new session, no reconnect storm
                finished = engine.stats().finished
                assert (finished["stop"] + finished["length"], finished["error"]) == (
                    len(completed) + N, len(failed) + len(down))
                await _settle(engine, stages)
                with capsys.disabled():
                    print(f"\n{case}: wave 1: {len(completed)} completed ({len(ended_before)} before the kill), "
                          f"{len(failed)} failed ({len(running & failed)} of {len(running)} in flight, "
                          f"{len(had_state)} of them after 1-{max(len(w1.outcomes[j].tokens) for j in had_state)} "
                          f"tokens, "
                          f"{len(waiting & failed)} of {len(waiting)} waiting); all ended "
                          f"{(t_ended - w1.t_kill) * 1000:.0f} ms after the kill; restart {t_restart:.2f} s; "
                          f"wave 2: {N}/{N} served = solo, its first token "
                          f"{min(o.ttft_s for o in outcomes2) * 1000:.0f} ms after the restart, in {t_wave2:.2f} s")
