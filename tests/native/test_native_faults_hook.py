"""Faults injected inside llama.cpp (patches/0008's test-only hook), through the engine: llama_decode fails
at its own failure points and runs its own cleanup, and the engine fails exactly the requests of the
faulted step with a named error, frees their cells and serves on.

- COMPUTE: a ubatch's graph computes, then reports failure (llama_decode -3, DecodeError); ABORT: the
  abort callback stops the compute (2, DecodeAbortedError). The step's requests end with a
  StepFailedError caused by that error; every other request gets its solo tokens (batch-invariant).
- KV_SLOT: the memory finds no slot for the batch (1, NoKvSlotError). Once, it is pressure, not a
  failure: the engine rolls back, preempts and recomputes, and every request gets its solo tokens. For
  as long as it lasts, the engine fails requests with the NoKvSlotError rather than retrying forever.
- `skippy serve` under SKIPPY_TEST_FAULT: the faulted request gets an OpenAI-style error (an error
  event when streaming), the next one succeeds.
"""
# The engines here admit by memory alone (slo_scheduling=False): which step fails is chosen by its shape and
# order, and the latency targets (derived from the first steps when the probe is off, as it is under
# SKIPPY_TEST_FAULT) would move them.


from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import numpy as np
import pytest
import trio

import skippy
from skippy.errors import DecodeAbortedError, DecodeError, NoKvSlotError, StepFailedError
from skippy.kv import ComponentKind
from skippy.native import Batch, Context, ContextOptions, FaultKind, Model

from _fault_runs import prompt, run_load, solo
from server._live import wait_healthy

pytestmark = pytest.mark.native

CAUSES = {FaultKind.COMPUTE: (DecodeError, -3), FaultKind.ABORT: (DecodeAbortedError, 2),
          FaultKind.KV_SLOT: (NoKvSlotError, 1)}


def lanes_idle(engine) -> bool:
    """No lane holds a cell or a recurrent state, and the attention cells in use are the prefix cache's."""
    ctx = engine.runtime.ctx
    if any(ctx.seq_pos_max(s) != -1 for s in range(engine.lanes.ceiling)):
        return False
    attn = engine.runtime.ledger().get(ComponentKind.ATTN)
    return attn is None or attn.used <= engine.stats().prefix_resident_tokens


async def settled_idle(engine, timeout: float = 10.0) -> bool:
    with trio.move_on_after(timeout):
        await engine.settled()
        return lanes_idle(engine)
    return False


def tokens_of(events) -> list[int]:
    return [e.token for e in events if e.token is not None]


# -- the hook itself, on a bare context ------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "falcon-h1"])
@pytest.mark.parametrize("kind", list(FaultKind), ids=lambda k: k.name.lower())
def test_the_hook_fails_the_armed_decode_through_llama_cpps_cleanup(synth_model_path, family, kind):
    """The decode after `after` others fails with the kind's return code, once; llama.cpp's own cleanup
    ran: no cell of the failed batch is left (attention), or - a recurrent state cannot be rolled back
    part way - the sequence is left at the failed batch's end and must be dropped whole. The context
    then decodes on with the same logits as before."""
    error, code = CAUSES[kind]
    with Model(synth_model_path(family), repack=False) as model:
        opts = ContextOptions(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, threads=1, batch_invariant=True)
        with Context(model, opts) as ctx:
            batch = Batch(64)

            def decode(seq: int, start: int, n: int) -> np.ndarray:
                return ctx.decode(batch.set(np.array(prompt(1, start + n)[start:], dtype=np.int32),
                                            np.arange(start, start + n), seq))

            want = decode(0, 0, 12)[-1].copy()
            ctx.arm_test_fault(kind, after=1)
            decode(1, 0, 7)  # passes: the one point skipped
            with pytest.raises(error) as info:
                decode(1, 7, 5)
            assert type(info.value) is error and info.value.code == code
            assert ctx.test_faults_fired == 1
            recurrent = ctx.ledger().get(ComponentKind.RECURRENT) is not None
            if kind is FaultKind.KV_SLOT or not recurrent:
                assert ctx.seq_pos_max(1) == 6  # nothing of the failed batch stayed
            else:
                assert ctx.seq_pos_max(1) == 11  # llama.cpp's seq_rm cannot cut a recurrent state
                ctx.seq_rm(1)
                decode(1, 0, 7)
            assert np.array_equal(decode(1, 7, 5)[-1], want)  # the fault fired once; nothing else changed
            assert ctx.test_faults_fired == 1 and ctx.seq_pos_max(0) == 11


@pytest.mark.parametrize("kind", [FaultKind.COMPUTE, FaultKind.ABORT], ids=lambda k: k.name.lower())
def test_a_failed_ubatch_after_a_computed_one_leaves_the_first_in_memory(synth_model_path, kind):
    """A 10-token batch in 4-token ubatches whose second ubatch fails: llama.cpp removes that ubatch's
    positions and after, but keeps the first's cells, so llama_decode's caller must drop the sequence
    (the engine fails the step's requests and frees their sequences whole)."""
    with Model(synth_model_path("llama"), repack=False) as model:
        opts = ContextOptions(n_ctx=256, n_batch=64, n_ubatch=4, n_seq_max=1, threads=1)
        with Context(model, opts) as ctx:
            ctx.arm_test_fault(kind, after=1)
            with pytest.raises(CAUSES[kind][0]):
                ctx.decode(Batch(64).set(np.array(prompt(2, 10), dtype=np.int32), np.arange(10), 0))
            assert ctx.seq_pos_max(0) == 3 and ctx.ledger().get(ComponentKind.ATTN).used == 4


def test_a_kv_slot_fault_fails_the_last_of_several_ubatches_and_restores_the_cells(synth_model_path):
    """A 20-token batch in 4-token ubatches: the memory places the first four, finds no slot for the last,
    and its restore undoes the four; the ledger is where it was."""
    with Model(synth_model_path("llama"), repack=False) as model:
        opts = ContextOptions(n_ctx=256, n_batch=64, n_ubatch=4, n_seq_max=1, threads=1)
        with Context(model, opts) as ctx:
            before = ctx.ledger()
            ctx.arm_test_fault(FaultKind.KV_SLOT)
            with pytest.raises(NoKvSlotError):
                ctx.decode(Batch(64).set(np.array(prompt(2, 20), dtype=np.int32), np.arange(20), 0))
            assert ctx.ledger() == before and ctx.seq_pos_max(0) == -1


def test_arming_from_the_environment(synth_model_path, monkeypatch):
    monkeypatch.setenv("SKIPPY_TEST_FAULT", "abort:2")
    with Model(synth_model_path("llama"), repack=False) as model:
        with Context(model, ContextOptions(n_ctx=128, n_batch=8, n_ubatch=8, threads=1)) as ctx:
            batch = Batch(8)
            for pos in range(2):
                ctx.decode(batch.set([300 + pos], [pos], 0))
            with pytest.raises(DecodeAbortedError):
                ctx.decode(batch.set([302], [2], 0))
            ctx.decode(batch.set([302], [2], 0))
            assert ctx.test_faults_fired == 1
        monkeypatch.setenv("SKIPPY_TEST_FAULT", "sideways:1")
        with pytest.raises(skippy.errors.InvalidInputError, match="SKIPPY_TEST_FAULT"):
            Context(model, ContextOptions(n_ctx=128, threads=1))


# -- the engine ------------------------------------------------------------------------------------


FAMILIES = ["llama", "falcon-h1"]
SPECS = [(prompt(i, 8 + 5 * i), 10 + i) for i in range(8)]
AFTER = [prompt(50, 9), 8]


# where the fault lands: (requests, ubatches before it). 8 requests on 4 lanes: in the first step (prefill
# only), or - armed when the first step that only decodes is reported, None - in the next, which only decodes
# while others wait; 4 requests on 4 lanes: in steady decoding, where each step is launched before the last
# one's tokens are routed (the chained step behind the failed one is skipped)
WHERE = {"prefill": (SPECS, 0), "decode": (SPECS, None), "overlapped": ([(p, m + 12) for p, m in SPECS[:4]], 8)}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", [FaultKind.COMPUTE, FaultKind.ABORT], ids=lambda k: k.name.lower())
@pytest.mark.parametrize("where", list(WHERE))
async def test_a_failed_decode_fails_exactly_its_steps_requests(synth_model_path, monkeypatch, family, kind, where):
    """Concurrent requests on 4 lanes; one ubatch fails inside llama.cpp. The requests of the step that
    carried it, as its report lists them, end with a StepFailedError caused by the decode's error; their
    cells and states are freed; every other request produces its solo tokens; a request afterwards is
    served."""
    from skippy.actors import runtime_owner

    path = synth_model_path(family)
    error, code = CAUSES[kind]
    specs, after = WHERE[where]
    want = solo(path, specs + [AFTER])
    launched_errors = []
    run_launched = runtime_owner.run_launched

    def spy(*args):
        result = run_launched(*args)
        if result.error is not None:
            launched_errors.append(result.error)
        return result

    monkeypatch.setattr(runtime_owner, "run_launched", spy)
    reports = []

    def on_step(report) -> None:
        reports.append(report)
        if after is None and report.decode_tokens and not report.prefill_tokens and len(reports) == 1 + sum(
                1 for r in reports if r.prefill_tokens):  # the first decode-only step: the next one fails
            engine.runtime.ctx.arm_test_fault(kind)

    with trio.fail_after(120):
        async with skippy.open_engine(path, n_ctx=1024, n_batch=64, n_seq_max=4, threads=1, slo_scheduling=False,
                                      on_step=on_step) as engine:
            if after is not None:
                engine.runtime.ctx.arm_test_fault(kind, after=after)
            ids, out = await run_load(engine, specs)
            idle = await settled_idle(engine)
            fired = engine.runtime.ctx.test_faults_fired
            launched_failed = list(launched_errors)  # (closing the engine aborts a step launched after this)
            later = tokens_of([e async for e in engine.generate(AFTER[0], max_tokens=AFTER[1])])
            stats = engine.stats()
    assert fired == 1 and idle
    [failed_step] = [r for r in reports if r.failed]
    in_step = set(failed_step.decode_ids) | set(failed_step.prefill_ids)
    assert bool(failed_step.prefill_tokens) == (where == "prefill")
    assert len(launched_failed) == (where == "overlapped")
    errored = set()
    for i, events in enumerate(out):
        assert sum(e.final for e in events) == 1 and events[-1].final
        tokens = tokens_of(events)
        if events[-1].finish_reason == "error":
            errored.add(ids[i])
            err = events[-1].error
            assert isinstance(err, StepFailedError) and type(err.__cause__) is error and err.__cause__.code == code
            assert tokens == want[i][: len(tokens)]  # what it got before the failure was right
        else:
            assert tokens == want[i], f"request {i}"
    assert errored == in_step and len(in_step) == failed_step.failed > 0
    assert later == want[-1]
    assert stats.finished["error"] == len(in_step)


@pytest.mark.parametrize("family", FAMILIES)
async def test_one_kv_slot_failure_is_pressure_every_request_completes(synth_model_path, family):
    """llama.cpp finds no slot once: nothing of the batch stays in memory, the engine preempts and the
    victims recompute; no request fails and every one produces its solo tokens."""
    path = synth_model_path(family)
    want = solo(path, SPECS + [AFTER])
    reports = []
    with trio.fail_after(120):
        async with skippy.open_engine(path, n_ctx=1024, n_batch=64, n_seq_max=4, threads=1, slo_scheduling=False,
                                      on_step=reports.append) as engine:
            engine.runtime.ctx.arm_test_fault(FaultKind.KV_SLOT, after=6)
            _, out = await run_load(engine, SPECS)
            idle = await settled_idle(engine)
            fired = engine.runtime.ctx.test_faults_fired
            later = tokens_of([e async for e in engine.generate(AFTER[0], max_tokens=AFTER[1])])
            stats = engine.stats()
    assert fired == 1 and idle
    assert [tokens_of(events) for events in out] == want[:-1] and later == want[-1]
    assert stats.finished["error"] == 0 and stats.preemptions >= 1
    assert not any(r.failed for r in reports)


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_kv_slot_failure_that_lasts_fails_requests_and_never_spins(synth_model_path, family):
    """llama.cpp finds no slot for any batch for a while: the engine preempts what it can, then fails
    the requests that still cannot run with a StepFailedError caused by the NoKvSlotError, instead of
    retrying the same batch forever; requests that got through have their solo tokens; once the memory
    takes batches again the engine serves."""
    path = synth_model_path(family)
    want = solo(path, SPECS + [AFTER])
    with trio.fail_after(120):
        async with skippy.open_engine(path, n_ctx=1024, n_batch=64, n_seq_max=4, threads=1, slo_scheduling=False) as engine:
            ctx = engine.runtime.ctx
            ctx.arm_test_fault(FaultKind.KV_SLOT, after=4, count=-1)
            _, out = await run_load(engine, SPECS)
            idle = await settled_idle(engine)
            ctx.arm_test_fault(None)
            fired = ctx.test_faults_fired
            later = tokens_of([e async for e in engine.generate(AFTER[0], max_tokens=AFTER[1])])
            stats = engine.stats()
    assert idle and fired > 0
    failed = 0
    for i, events in enumerate(out):
        assert sum(e.final for e in events) == 1 and events[-1].final
        tokens = tokens_of(events)
        if events[-1].finish_reason == "error":
            failed += 1
            err = events[-1].error
            assert isinstance(err, StepFailedError) and type(err.__cause__) is NoKvSlotError
            assert tokens == want[i][: len(tokens)]
        else:
            assert tokens == want[i]
    assert failed > 0 and stats.finished["error"] == failed
    assert later == want[-1]


# -- skippy serve ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_skippy_serve_turns_an_injected_decode_failure_into_an_api_error(synth_model_path, stream):
    """SKIPPY_TEST_FAULT=compute:2 arms the serving context (not the load probe's): the first request's
    third decode fails inside llama.cpp; it gets a 500 generation_failed error body (streaming: an
    error event, then [DONE]); the next request is served."""
    synth_model_path("llama")
    port = _free_port()
    env = {**os.environ, "SKIPPY_TEST_FAULT": "compute:2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippy", "serve", "--family", "llama", "--port", str(port), "--threads", "1",
         "--n-ctx", "512"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    body = {"model": "llama", "prompt": "hello there", "max_tokens": 8, "ignore_eos": True}
    try:
        with trio.fail_after(90):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                await wait_healthy(http)
                if stream:
                    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                        assert r.status_code == 200
                        data = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
                    assert data[-1] == "[DONE]"
                    error = json.loads(data[-2])["error"]
                    assert all("choices" in json.loads(d) for d in data[:-2])  # tokens before the fault
                else:
                    r = await http.post("/v1/completions", json=body)
                    assert r.status_code == 500
                    error = r.json()["error"]
                assert error["code"] == "generation_failed" and error["type"] == "server_error"
                assert "llama_decode failed with code -3" in error["message"]
                r = await http.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["finish_reason"] == "length"
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert "SKIPPY_TEST_FAULT=compute:2" in out and "Traceback" not in out, out[-3000:]
