"""Faults on the real library: an exception inside a real step fails only that step's requests
and the engine serves on (cells freed, other outputs unchanged); cancelling the engine's enclosing
scope during a real llama_decode aborts it and leaves no thread, task or waiting consumer; a
malformed model file fails at load with a named error, through open_engine and `skippy serve`."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import trio

import skippy
from skippy.errors import DecodeAbortedError, ModelLoadError, StepFailedError
from skippy.kv import ComponentKind

from _fault_runs import prompt, run_load, solo

pytestmark = pytest.mark.native


def lanes_idle(engine) -> bool:
    """No lane seq id holds a cell and the attention cells in use are the prefix cache's."""
    ctx = engine.runtime.ctx
    held = [s for s in range(engine.lanes.ceiling) if ctx.seq_pos_max(s) != -1]
    return not held and engine.runtime.ledger().get(ComponentKind.ATTN).used <= engine.stats().prefix_resident_tokens


async def becomes_idle(engine, timeout: float = 5.0) -> bool:
    """The last final event can reach its consumer a step before the composer releases that
    sequence: wait for the engine to settle, then look at the lanes."""
    with trio.move_on_after(timeout):
        await engine.settled()
        return lanes_idle(engine)
    return False


@pytest.mark.parametrize("when", ["before", "after"], ids=["before-llama-decode", "after-llama-decode"])
async def test_a_failing_real_step_fails_only_its_requests(synth_model_path, when):
    """The 6th call to runtime.decode (made by the RuntimeOwner in its worker thread) raises, either
    before llama_decode ran or after it wrote the batch's cells: the requests of that step, as its
    report lists them, end with a StepFailedError; their cells are freed; every other request
    produces its solo tokens; the engine serves a new request afterwards."""
    path = synth_model_path("llama")
    specs = [(prompt(i, 8 + 5 * i), 10 + i) for i in range(10)]
    want = solo(path, specs + [(prompt(50, 9), 8)])
    reports = []
    calls = 0
    with trio.fail_after(60):
        async with skippy.open_engine(path, n_ctx=1024, n_batch=64, n_seq_max=4, threads=1,
                                      on_step=reports.append) as engine:
            decode = engine.runtime.decode

            def faulty(*args):
                nonlocal calls
                calls += 1
                if calls == 6:
                    if when == "after":
                        decode(*args)
                    raise RuntimeError(f"injected fault {when} llama_decode")
                return decode(*args)

            engine.runtime.decode = faulty
            ids, out = await run_load(engine, specs)
            after = [e.token async for e in engine.generate(prompt(50, 9), max_tokens=8) if e.token is not None]
            idle = await becomes_idle(engine)
            stats = engine.stats()
    [failed_step] = [r for r in reports if r.failed]
    in_step = set(failed_step.decode_ids) | set(failed_step.prefill_ids)
    errored = set()
    for i, events in enumerate(out):
        assert sum(e.final for e in events) == 1 and events[-1].final
        tokens = [e.token for e in events if e.token is not None]
        if events[-1].finish_reason == "error":
            errored.add(ids[i])
            assert isinstance(events[-1].error, StepFailedError) and "injected fault" in str(events[-1].error)
            assert tokens == want[i][: len(tokens)]  # what it got before the failure was right
        else:
            assert tokens == want[i]
    assert errored == in_step and len(in_step) == failed_step.failed > 0
    assert after == want[-1]
    assert idle and stats.finished["error"] == len(in_step)


async def test_cancelling_the_enclosing_scope_during_a_real_decode_aborts_it(synth_model_path):
    """A 1500-token prompt is one long llama_decode (seconds with batch-invariant attention). Cancel
    the scope around the engine while it computes: llama_decode returns aborted, the worker thread
    is joined, the context and model are closed, no actor task is left; a consumer outside the scope
    gets a final "cancelled" event, one inside is cancelled with it."""
    path = synth_model_path("llama")
    before = {t.ident for t in threading.enumerate()}
    entered = threading.Event()
    raised: list[BaseException] = []
    outside: list = []
    inside: list[str] = []

    async def consume_inside(stream):
        try:
            async for _ in stream:
                pass
        except trio.Cancelled:
            inside.append("cancelled")
            raise

    async def consume_outside(stream):
        outside.extend([e async for e in stream])

    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            with trio.CancelScope() as scope:
                async with skippy.open_engine(path, n_ctx=2048, n_batch=2048, n_seq_max=4, threads=1) as engine:
                    worker, runtime = engine.worker, engine.runtime
                    decode = runtime.decode

                    def watched(*args):
                        entered.set()
                        try:
                            return decode(*args)
                        except BaseException as exc:
                            raised.append(exc)
                            raise

                    runtime.decode = watched
                    async with trio.open_nursery() as inner:
                        inner.start_soon(consume_inside, engine.generate(prompt(1, 1500), max_tokens=4))
                        outer.start_soon(consume_outside, engine.generate(prompt(2, 20), max_tokens=4))
                        while not entered.is_set():
                            await trio.sleep(0.001)
                        await trio.sleep(0.05)
                        t_cancel = time.monotonic()
                        scope.cancel()
                        await trio.sleep_forever()
            shutdown = time.monotonic() - t_cancel
        tasks, stack = [], [trio.lowlevel.current_root_task()]
        while stack:
            task = stack.pop()
            tasks.append(task.name)
            stack.extend(t for n in task.child_nurseries for t in n.child_tasks)
    assert [n for n in tasks if n.startswith("skippy.")] == []
    assert len(raised) == 1 and isinstance(raised[0], DecodeAbortedError), raised
    assert shutdown < 1.0, f"shutdown took {shutdown:.2f}s: the decode was not aborted"
    assert not worker.alive and {t.ident for t in threading.enumerate()} <= before
    assert runtime.ctx.closed and runtime.model.closed
    assert inside == ["cancelled"]
    assert sum(e.final for e in outside) == 1 and outside[-1].finish_reason == "cancelled"


# -- malformed model files at load ----------------------------------------------------------------


@pytest.fixture
def bad_models(tmp_path, synth_model_path):
    data = synth_model_path("llama").read_bytes()
    files = {
        "truncated": data[: len(data) // 2],
        "tail-cut": data[:-1000],
        "not-gguf": b"this is not a model\n" * 50,
        "header-only": b"GGUF" + (3).to_bytes(4, "little"),
    }
    paths = {}
    for name, content in files.items():
        paths[name] = tmp_path / f"{name}.gguf"
        paths[name].write_bytes(content)
    return paths


async def test_open_engine_on_a_malformed_model_fails_with_a_named_error(bad_models, synth_model_path):
    before = {t.ident for t in threading.enumerate()}
    with trio.fail_after(60):
        for name, path in bad_models.items():
            with pytest.raises(ModelLoadError):
                async with skippy.open_engine(path, n_ctx=256, threads=1):
                    pytest.fail(f"{name}: the engine opened")
        assert {t.ident for t in threading.enumerate()} <= before  # no worker started, none left
        async with skippy.open_engine(synth_model_path("llama"), n_ctx=256, threads=1) as engine:  # still fine
            assert [e async for e in engine.generate(prompt(1, 5), max_tokens=3)][-1].finish_reason == "length"


@pytest.mark.parametrize("name", ["truncated", "tail-cut", "not-gguf"])
async def test_skippy_serve_refuses_a_malformed_model_cleanly(bad_models, name):
    """`skippy serve --model BAD` exits 2 with a one-line named error, never binds, no traceback."""
    with trio.fail_after(120):
        proc = await trio.run_process(
            [sys.executable, "-m", "skippy", "serve", "--model", str(bad_models[name]), "--port", "0", "--threads", "1"],
            capture_stdout=True, capture_stderr=True, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err[-2000:]
    assert "skippy: error:" in err and "Traceback" not in err and "serving" not in err


async def test_a_model_that_aborts_llama_cpp_is_refused_by_serve(tmp_path, monkeypatch, native_build):
    """A structurally valid GGUF that makes llama.cpp's loader abort (qwen3next without expert_count):
    the probe process turns the crash into a ModelLoadError before serve loads it in-process."""
    from skippy.models import synth

    write_hparams = synth._Model.hparams
    monkeypatch.setattr(synth._Model, "hparams",
                        lambda self, values: write_hparams(self, {k: v for k, v in values.items() if k != "expert_count"}))
    path = synth.write_synthetic("qwen3next", tmp_path / "aborts.gguf")
    with trio.fail_after(120):
        proc = await trio.run_process([sys.executable, "-m", "skippy", "serve", "--model", str(path), "--port", "0"],
                                      capture_stdout=True, capture_stderr=True, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err[-2000:]
    assert "cannot load this file safely" in err and "serving" not in err and "Traceback" not in err
