"""What the actors say to each other. Frozen; `reply` is the caller's one-shot channel."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from ..kv import ComponentKind, Ledger
from ..sampling import Sampler
from ..scheduling.composer import StepPlan
from ..scheduling.memory import Headroom
from ..scheduling.requests import Request

# -- to the RuntimeOwner ---------------------------------------------------------


@attrs.frozen
class Step:
    plan: StepPlan
    samplers: tuple[Sampler, ...]  # one per output row
    reply: Any


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


@attrs.frozen
class Release:
    """seq_rm each sequence entirely; replies with the ledger after."""

    seq_ids: tuple[int, ...]
    reply: Any


@attrs.frozen
class ShareCells:
    """dst gets src's first `length` positions (seq_cp: attention cells shared, not copied),
    as far as the family allows; replies with a Shared."""

    src: int
    dst: int
    length: int
    reply: Any


@attrs.frozen
class Shared:
    granted: int  # positions dst now holds: `length`, or 0 when the family could not share
    ledger: Ledger


@attrs.frozen
class LedgerQuery:
    """The ledger now (memory may change without a step, e.g. taken by another tenant)."""

    reply: Any


# -- to Admission ------------------------------------------------------------------


@attrs.frozen
class Submit:
    request: Request
    reply: Any  # None, or the exception to raise in the caller


@attrs.frozen
class Cancel:
    request: Request


@attrs.frozen
class AdmitQuery:
    headroom: Headroom
    reply: Any
    # prefix lookup (request, admitted this round) -> Share | None; the composer's cache, read
    # while the composer awaits this very reply, so nothing changes it meanwhile
    match: Callable[[Request, Sequence[Request]], Any] | None = None


@attrs.frozen
class Admitted:
    requests: tuple[Request, ...]
    waiting: int
    blocked: Mapping[ComponentKind, int] | None = None  # cells the queue head lacked, if memory stopped it


@attrs.frozen
class Requeue:
    """Preempted requests back to the head of the queue; answered once they are there."""

    requests: tuple[Request, ...]
    reply: Any


@attrs.frozen
class Released:
    """Lanes back to the pool; answered once they are (so lane counts are never seen in flight)."""

    seq_ids: tuple[int, ...]
    reply: Any


# -- to Preemption -------------------------------------------------------------------


@attrs.frozen
class Pressure:
    running: tuple[Request, ...]
    missing: Mapping[ComponentKind, int]
    at_least: int
    reply: Any


@attrs.frozen
class Preempted:
    victims: tuple[Request, ...]
    ledger: Ledger


# -- to the Composer -------------------------------------------------------------------


@attrs.frozen
class Wake:
    """Something changed (a submission, a cancellation): look again."""
