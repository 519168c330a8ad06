"""What the actors say to each other. Frozen.

The actors ask each other directly (one trio thread). What still travels: a `Call` into the
runtime owner's inbox (callers off the step's path) with the caller's one-shot reply channel,
the composer's `Wake`, and preemption's `Requeue` to admission.
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
class Requeue:
    """Preempted requests back to the head of the queue; answered once they are there."""

    requests: tuple[Request, ...]


@attrs.frozen
class Wake:
    """Something changed (a submission, a cancellation): look again."""
