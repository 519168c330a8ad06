"""Run-ahead: steady decode steps that go on without the event loop, their tokens written as sampled.

Chained decoding (scheduling.step, _chain) still wakes the event loop once per token: it collects the
step, composes the next, routes and streams the tokens. At N=1 that burst is most of the CPU a token
costs outside ggml (bench/results/run-ahead), and on 2 cores that CPU is wall time. When every
running stream is read inline (GenerationStream.divert: the server writes a token's bytes itself), a
run asks the worker thread to decode up to `steps` steps back to back. After each, `route` (below)
routes its tokens and offers their events to the streams' taps, on the worker thread; the step
scheduler accounts the steps (totals, reports) when it collects the run.

Why it stays exact: a step of the run is the step the loop would have composed (`StepPlan.advanced`,
the sampled tokens), and `route` does what `Composer.apply` does for a token that does not end its
request. It declines (touching nothing) any step where a token might end one (end of generation,
the last token, a cancel) or a stream is not taking events inline; that step, and only that, goes
back to the event loop, which routes it as any other. While a run is out the step scheduler waits
for it, so nothing else touches the running requests; a wake-up of the composer (an arrival, a
cancel) sets `stop`, and the run ends after the decode it is in, as a chained step would.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import attrs

from ..kv import ComponentKind
from .composer import Emitted, StepPlan, _text_and_finish
from .effects import Launch
from .requests import RequestState, TokenEvent

RUN_STEPS = 128  # at most this many steps per run: stats and metrics lag a run behind at most
READY_WAIT_S = 5.0  # the loop routes the step before the run in well under this; past it the run ends


@attrs.frozen(eq=False)
class RunAhead:
    """A run's terms. `route(plan, result)` -> (routed, undelivered events, go on); `ready` is set once
    the loop has routed the step launched before the run (the run routes after it); `stop` ends the
    run after the decode it is in."""

    steps: int
    route: Callable[[StepPlan, Any], tuple[bool, tuple[Emitted, ...], bool]]
    stop: threading.Event = attrs.field(factory=threading.Event)
    ready: threading.Event = attrs.field(factory=threading.Event)


@attrs.frozen
class RunResult:
    """Each step the run decoded, in order, with whether it was routed on the worker thread (only the
    last may not be), and the events of the last routed step that a stream refused (the loop delivers
    them, first)."""

    steps: tuple[tuple[StepPlan, Any, bool], ...]
    undelivered: tuple[Emitted, ...] = ()


def offers(sink: Any) -> bool:
    """Whether a stream's sink takes events inline (a diverted stream's tap)."""
    return getattr(sink, "offer", None) is not None and getattr(sink, "take", None) is not None


def may_run(plan: StepPlan) -> bool:
    """Whether the steps from `plan` on (all decode) may run ahead: every stream is read inline, and
    none has stop strings (the text decides where those end) or logprobs (rows the loop assembles)."""
    if plan.rows is not None:
        return False
    for c in plan.chunks:
        r = c.request
        if r.stop or r.stop_ids or not offers(r.sink):
            return False
    return True


def route(plan: StepPlan, result: Any, reserve: int) -> tuple[bool, tuple[Emitted, ...], bool]:
    """Route one step of a run (on the worker thread): (routed, undelivered, go on).

    Declines, changing nothing, where `Composer.apply` might end a request or the loop must look."""
    if result.error is not None or result.skipped or result.tokens is None:
        return False, (), False
    chunks = plan.chunks
    eog = result.eog
    for i, c in enumerate(chunks):
        r = c.request
        if (r.cancel_requested or r.state is not RequestState.RUNNING or r.remaining <= 1
                or (eog[i] and not r.ignore_eos) or not getattr(r.sink, "armed", False)):
            return False, (), False
    tokens = result.tokens.tolist()
    pieces = result.pieces
    t_sampled = result.t_sampled
    emitted = []
    for i, c in enumerate(chunks):
        r = c.request
        r.cached += 1
        r.generated.append(tokens[i])
        text, _ = _text_and_finish(r, pieces[i], False)  # neither ends it: no stop strings, tokens remain
        emitted.append(Emitted(r, TokenEvent(tokens[i], text, len(r.generated) - 1, t_sampled=t_sampled)))
    undelivered = tuple(e for e in emitted if not e.request.sink.offer(e.event))
    attn = result.ledger.get(ComponentKind.ATTN)
    go_on = not undelivered and (attn is None or attn.free >= plan.n_tokens + reserve)
    return True, undelivered, go_on


def run_steps(launch: Launch, before: Any, run_launched: Callable[[Any, Any], Any]) -> RunResult:
    """The run itself (on the worker thread): decode, route, go on. `run_launched(launch, before)` runs
    one chained step on the runtime (actors.runtime_owner)."""
    spec: RunAhead = launch.run
    plan, samplers = launch.plan, launch.samplers
    one = Launch(plan, samplers, chained=launch.chained)
    steps: list[tuple[StepPlan, Any, bool]] = []
    undelivered: tuple[Emitted, ...] = ()
    while True:
        result = run_launched(one, before)
        if not steps and (result.skipped or result.error is not None or not spec.ready.wait(READY_WAIT_S)
                          or spec.stop.is_set()):
            steps.append((plan, result, False))  # the loop finishes it, as any chained step
            break
        routed, undelivered, go_on = spec.route(plan, result)
        steps.append((plan, result, routed))
        if not routed or not go_on or len(steps) >= spec.steps or spec.stop.is_set():
            break
        before, plan = result, plan.advanced()
        one = Launch(plan, samplers, chained=True)
    return RunResult(tuple(steps), undelivered)
