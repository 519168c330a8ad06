"""What a step asks the world to do, and the answers it gets back: plain frozen data.

The step (scheduling.step) is a generator that yields these and is sent the answers, so
the same step runs under the trio actors (each effect becomes one call to the actor that
owns the resource) and under a synchronous driver in tests (skippy.testing), with no
copy of its logic in either.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from ..kv import ComponentKind, Ledger
from ..sampling import Sampler
from .composer import Emitted, StepPlan
from .memory import Headroom
from .requests import Request

# -- asked of admission (the owner of the waiting queue and the lanes) -----------------


@attrs.frozen
class Admit:
    """Take requests from the head of the queue within `headroom`; answered with Admitted."""

    headroom: Headroom
    # prefix lookup (request, admitted this round) -> Share | None, read while the step waits for
    # this very answer, so nothing changes the cache meanwhile
    match: Callable[[Request, Sequence[Request]], Any] | None = None
    slo: Any = None  # the running set against the latency targets (scheduling.slo.SloGate); None: no targets


@attrs.frozen
class Admitted:
    requests: tuple[Request, ...]
    waiting: int
    blocked: Mapping[ComponentKind, int] | None = None  # cells the queue head lacked, if memory stopped it


@attrs.frozen
class ReturnLanes:
    """Sequence ids of released requests go back to the lane pool; answered with None."""

    seq_ids: tuple[int, ...]


# -- asked of preemption ----------------------------------------------------------------


@attrs.frozen
class Preempt:
    """Choose victims among `running` until `missing` cells are free (at least `at_least`), free
    their cells and requeue them; answered with Preempted."""

    running: tuple[Request, ...]
    missing: Mapping[ComponentKind, int]
    at_least: int


@attrs.frozen
class Preempted:
    victims: tuple[Request, ...]
    ledger: Ledger


# -- asked of the runtime owner -----------------------------------------------------------


@attrs.frozen
class Decode:
    """One step on the runtime: the plan's batch, one sample per output row; answered with StepResult."""

    plan: StepPlan
    samplers: tuple[Sampler, ...]  # one per output row


@attrs.frozen
class Launch:
    """Start a step on the runtime and answer at once with a ticket (its result comes with Collect).
    `chained`: its decode tokens are the tokens the step launched before it samples, filled in on
    the worker thread, so it starts the moment that one ends (overlap: the next step computes
    while this one's tokens are routed and streamed)."""

    plan: StepPlan
    samplers: tuple[Sampler, ...]
    chained: bool = False
    run: "RunAhead | None" = None  # chained, and the steps after it too, off the event loop (scheduling.run_ahead)


@attrs.frozen
class Collect:
    """Wait for a launched step; answered with its StepResult (a RunResult for a launched run)."""

    ticket: Any
    run: "RunAhead | None" = None


@attrs.frozen
class StepResult:
    ledger: Ledger
    tokens: np.ndarray | None = None  # one per output row
    pieces: tuple[bytes, ...] = ()
    eog: tuple[bool, ...] = ()
    t_decode: float = 0.0
    t_sample: float = 0.0
    error: Exception | None = None
    lost: tuple[int, ...] = ()  # seq ids whose memory could not be rolled back after a failed step
    t_sampled: float = 0.0  # time.perf_counter() when the tokens were sampled (delivery latency starts here)
    skipped: bool = False  # a chained step whose predecessor failed: it never ran, nothing changed
    logprobs: Any = None  # logprobs.RowLogprobs, when the plan's rows asked for them


@attrs.frozen
class FreeCells:
    """seq_rm each sequence entirely (a cell goes only when no other sequence holds it); answered
    with the ledger after."""

    seq_ids: tuple[int, ...]


@attrs.frozen
class ShareCells:
    """dst gets src's first `length` positions (seq_cp: attention cells shared, not copied), as far
    as the family allows; answered with Shared."""

    src: int
    dst: int
    length: int


@attrs.frozen
class Shared:
    granted: int  # positions dst now holds: `length`, or 0 when the family could not share
    ledger: Ledger


@attrs.frozen
class ReadLedger:
    """The ledger now (memory may change without a step, e.g. taken by another tenant)."""


# -- asked of the driver itself ---------------------------------------------------------------


@attrs.frozen
class Deliver:
    """Events to the requests' streams (never blocks: a stream that went away is skipped)."""

    events: tuple[Emitted, ...]


@attrs.frozen
class Idle:
    """Nothing to run: wait for a submission or a cancellation (at most `poll` seconds when requests
    wait for memory someone else holds), then answer with the ledger as it is then."""

    poll: float | None
