"""Run-ahead (scheduling.run_ahead): steady decode steps of inline-read streams go on from the worker
thread. The real engine and actors over a FakeRuntime (scheduler plumbing, no llama claim): the same
tokens, each once and in order; the same steps and reports; an arrival or a cancel stops a run within
a step; what a run may not do (stop strings, logprobs, in-process readers) stays on the event loop."""

from __future__ import annotations

import threading
import time
from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio

from skippy.kv import ComponentKind, Ledger, MemoryComponent
from skippy.scheduling import composer as C
from skippy.scheduling.requests import Request, RequestState
from skippy.scheduling.run_ahead import may_run, route
from skippy.testing import FakeRuntime, open_fake_engine

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def fake(decode_s: float = 0.0) -> FakeRuntime:
    """`decode_s`: each decode takes that long, as a model's do (a run is out for a while)."""
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=4, n_vocab=64)
    if decode_s:
        rt.on_decode = lambda: time.sleep(decode_s)
    return rt


async def _diverted(engine, prompt, n, takes, **kw):
    """Read a stream as the server does (diverted after its first event); (thread, event) per taken event."""
    stream = engine.generate(prompt, max_tokens=n, ignore_eos=True, **kw)
    events = list(await stream.batch())

    def take(event):
        takes.append((threading.get_ident(), event))
        return True

    stream.divert(take)
    while True:
        batch = await stream.batch()
        if not batch:
            return events
        events += batch


def _tokens(events):
    return [e.token for e in events if e.token is not None]


@pytest.mark.parametrize("run_ahead", [True, False])
async def test_a_diverted_stream_gets_the_same_tokens_steps_and_reports_with_or_without_runs(run_ahead):
    rt = fake()
    reports = []
    takes: list = []
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_cache=False, run_ahead=run_ahead, on_step=reports.append) as engine:
            read = await _diverted(engine, PROMPT, 120, takes)
            await engine.settled()
            stats = engine.stats()
    loop = threading.get_ident()
    merged = sorted([(e.index, e) for _, e in takes] + [(e.index, e) for e in read if e.token is not None],
                    key=lambda p: p[0])
    assert [e.token for _, e in merged] == rt.solo(PROMPT, 120)  # each once, in order
    assert [i for i, _ in merged] == list(range(120))
    off_loop = sum(t != loop for t, _ in takes)
    if run_ahead:
        assert off_loop >= 60  # taken on the worker thread, in the runs (over 100 on an idle box)
        assert stats.run_ahead_steps == off_loop  # one event per routed step: N=1
    else:
        assert off_loop == 0 and stats.run_ahead_steps == 0
    # one step and one report per decode either way: the prompt's step and 119 decodes
    assert stats.steps == len(reports) == 120 and stats.output_tokens == 120
    assert [r.step for r in reports] == list(range(1, 121))
    assert stats.finished["length"] == 1


async def test_an_arrival_stops_a_run_within_a_step():
    """The second request's prompt is computed within two steps of its submission, not a run later."""
    rt = fake(decode_s=0.005)  # long enough for a busy event loop to see the arrival within a decode
    reports = []
    takes: list = []
    with trio.fail_after(20):
        async with open_fake_engine(rt, prefix_cache=False, on_step=reports.append) as engine:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_diverted, engine, PROMPT, 200, takes)
                while len(takes) < 40:  # well inside a run
                    await trio.sleep(0.001)
                submitted_at = rt.decodes  # stats count a run's steps when it is collected: the runtime counts them now
                other = engine.generate([7, 7, 7], max_tokens=2)
                first = await other.__anext__()
                assert first.token is not None
                await other.aclose()
    admitted = next(r.step for r in reports if other.request.id in r.prefill_ids)
    assert admitted - submitted_at <= 3, (submitted_at, admitted)


@asynccontextmanager
async def _mid_run(engine, n_tokens: int):
    """(stream, its reader's nursery) of a diverted stream read in a task, once 20 of its events were
    taken: a run is out."""
    takes: list = []
    stream = engine.generate(PROMPT, max_tokens=n_tokens, ignore_eos=True)
    await stream.batch()
    stream.divert(lambda e: takes.append(e) or True)
    async with trio.open_nursery() as nursery:
        async def read():
            async for _ in stream:
                pass

        nursery.start_soon(read)
        while len(takes) < 20:
            await trio.sleep(0.001)
        yield stream, nursery


async def test_a_cancel_during_a_run_ends_it_and_frees_the_request():
    rt = fake(decode_s=0.001)
    with trio.fail_after(20):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            async with _mid_run(engine, 500) as (stream, _):
                stream.cancel()
            await engine.settled()
            stats = engine.stats()
            assert stats.running == 0 and engine.live == 0
            assert stats.kv_used.get(ComponentKind.ATTN, 0) == 0
            assert stats.decode_tokens < 200  # the run ended at the cancel, not 500 tokens later


async def test_the_run_routes_only_after_the_loop_routed_the_step_before_it(monkeypatch):
    """The event loop routes step k while the run's first decode computes; a slow loop (here: its
    routing sleeps) must not let the run route step k+1 first."""
    real = C.Composer.apply

    def slow_apply(self, *a, **kw):
        time.sleep(0.003)
        return real(self, *a, **kw)

    monkeypatch.setattr(C.Composer, "apply", slow_apply)
    rt = fake()
    takes: list = []
    with trio.fail_after(20):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            read = await _diverted(engine, PROMPT, 150, takes)
    events = sorted([e for _, e in takes] + [e for e in read if e.token is not None], key=lambda e: e.index)
    assert [e.token for e in events] == rt.solo(PROMPT, 150)
    assert [e.index for e in events] == list(range(150))
    assert [e.index for _, e in takes] == sorted(e.index for _, e in takes)  # taken in order too


async def test_streams_with_stop_strings_or_in_process_readers_never_run_ahead():
    rt = fake()
    takes: list = []
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            await _diverted(engine, PROMPT, 60, takes, stop=["\x00never"])
            plain = [e async for e in engine.generate(PROMPT, max_tokens=60, ignore_eos=True)]
    assert takes and all(t == threading.get_ident() for t, _ in takes)
    assert _tokens(plain) == rt.solo(PROMPT, 60)


async def test_closing_the_engine_during_a_run_does_not_hang():
    with trio.fail_after(20):
        async with open_fake_engine(fake(decode_s=0.001), prefix_cache=False) as engine:
            async with _mid_run(engine, 800) as (_, nursery):
                worker = engine.worker
                nursery.cancel_scope.cancel()
    assert not worker.alive


# -- route, alone -----------------------------------------------------------------------------


class _Sink:
    def __init__(self, armed=True, accept=True):
        self.armed, self.accept, self.take, self.got = armed, accept, object(), []

    def offer(self, event):
        self.got.append(event)
        return self.accept


def _step(n_requests=2, remaining=5, eog=False, **sink):
    reqs = []
    for i in range(n_requests):
        r = Request(i, np.array([1, 2, 3], dtype=np.int32), max_tokens=10)
        r.state, r.seq_id, r.cached = RequestState.RUNNING, i, 3
        r.generated = [9] * (10 - remaining)
        r.cached += len(r.generated) - 1
        r.assembler = C.TextAssembler(())
        r.sink = _Sink(**sink)
        reqs.append(r)
    chunks = tuple(C.Chunk(r, r.cached, 1, True, True) for r in reqs)
    n = len(chunks)
    plan = C.StepPlan(chunks, np.zeros(n, np.int32), np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32),
                      np.ones(n, np.int8), 0)

    class Result:
        error, skipped, t_sampled = None, False, 1.0
        tokens = np.array([7] * n, dtype=np.int32)
        pieces = (b"a",) * n
        ledger = Ledger((MemoryComponent(ComponentKind.ATTN, 100, 10, 0),))

    Result.eog = (eog,) * n
    return reqs, plan, Result


def test_route_routes_a_steady_step_and_offers_each_event():
    reqs, plan, result = _step()
    before = [(len(r.generated), r.cached) for r in reqs]
    routed, undelivered, go_on = route(plan, result, reserve=4)
    assert routed and undelivered == () and go_on
    for r, (g, c) in zip(reqs, before):
        assert len(r.generated) == g + 1 and r.generated[-1] == 7 and r.cached == c + 1
        (event,) = r.sink.got
        assert event.token == 7 and event.text == "a" and event.index == g and not event.final


@pytest.mark.parametrize("case", ["last token", "end of generation", "cancel", "not armed", "finished"])
def test_route_declines_where_the_loop_must_look_and_changes_nothing(case):
    reqs, plan, result = _step(remaining=1 if case == "last token" else 5, eog=case == "end of generation",
                               armed=case != "not armed")
    if case == "cancel":
        reqs[1].cancel_requested = True
    if case == "finished":
        reqs[0].state = RequestState.FINISHED
    before = [(list(r.generated), r.cached) for r in reqs]
    assert route(plan, result, reserve=4) == (False, (), False)
    assert [(list(r.generated), r.cached) for r in reqs] == before
    assert all(not r.sink.got for r in reqs)


def test_route_hands_refused_events_back_and_stops():
    reqs, plan, result = _step(accept=False)
    routed, undelivered, go_on = route(plan, result, reserve=4)
    assert routed and not go_on and [e.request for e in undelivered] == reqs


def test_route_stops_the_run_when_the_next_step_would_not_fit():
    reqs, plan, result = _step()
    result.ledger = Ledger((MemoryComponent(ComponentKind.ATTN, 100, 95, 0),))
    routed, _, go_on = route(plan, result, reserve=4)  # 5 free < 2 tokens + 4 reserved
    assert routed and not go_on


def test_may_run_needs_every_stream_inline_and_no_stop_strings():
    reqs, plan, _ = _step()
    assert may_run(plan)
    reqs[0].stop = ("x",)
    assert not may_run(plan)
    reqs[0].stop = ()
    reqs[1].sink = None
    assert not may_run(plan)


async def test_a_run_that_reaches_its_length_is_followed_at_once_by_the_next(monkeypatch):
    """No step is composed without overlap between two runs of a steady stream: the next one is launched
    chained on the last before the loop accounts the steps."""
    from skippy.actors.runtime_owner import RuntimeOwner
    from skippy.scheduling import step as S
    from skippy.scheduling.effects import Decode, Launch

    monkeypatch.setattr(S, "RUN_STEPS", 8)
    asked = {"unchained": 0, "chained": 0}  # steps started with nothing computing before them, or chained
    ask = RuntimeOwner.ask

    async def counted(self, what):
        asked["unchained"] += isinstance(what, Decode) or (isinstance(what, Launch) and not what.chained)
        asked["chained"] += isinstance(what, Launch) and what.chained
        return await ask(self, what)

    monkeypatch.setattr(RuntimeOwner, "ask", counted)
    rt = fake()
    takes: list = []
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_cache=False) as engine:
            read = await _diverted(engine, PROMPT, 120, takes)
            stats = engine.stats()
    events = sorted([e for _, e in takes] + [e for e in read if e.token is not None], key=lambda e: e.index)
    assert [e.token for e in events] == rt.solo(PROMPT, 120)
    assert stats.run_ahead_steps >= 100 and asked["chained"] >= 100 // 8
    # the prompt's step, the steps before the stream was diverted and, on a busy box, a refused offer or
    # two (the reader not yet waiting): without the follow-on, one per run of 8 steps (about 15)
    assert asked["unchained"] <= 5, asked
