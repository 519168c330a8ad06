"""What the actors say to each other. Frozen.

A message that wants an answer travels in a `Call` with the caller's one-shot reply
channel; what it asks is one of the step's effects (scheduling.effects: Admit, Preempt,
Decode, FreeCells, ShareCells, ReturnLanes, ReadLedger) or one of the messages below.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..scheduling.requests import Request


@attrs.frozen
class Call:
    what: Any
    reply: Any  # the caller's one-shot channel


@attrs.frozen
class Submit:
    """A new request for the queue; answered with None, or the exception to raise in the caller."""

    request: Request


@attrs.frozen
class Cancel:
    """The caller left: a waiting request leaves the queue (a running one is swept by the step)."""

    request: Request


@attrs.frozen
class Requeue:
    """Preempted requests back to the head of the queue; answered once they are there."""

    requests: tuple[Request, ...]


@attrs.frozen
class Wake:
    """Something changed (a submission, a cancellation): look again."""
