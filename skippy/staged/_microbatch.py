"""Pure pipeline bookkeeping: cutting a step into micro-batches, each stage's lanes, and the
order of answers going back up. No trio, no llama: the stage and stage-0 plumbing use these.

Why micro-batches: a step handed down whole keeps one stage busy at a time (the others wait:
a bubble of (K-1)/K per stage). Cut into M parts, stage 0 computes part 2 while stage 1 has
part 1, so the bubble falls to (K-1)/(M+K-1) of a step (GPipe's schedule within one step).
Cutting never changes what is computed: a part is a set of whole chunks of sequences, and a
sequence cut across parts is chunked prefill, exact under batch invariance.
"""

from __future__ import annotations

from typing import Iterator

import attrs
import numpy as np

from ..errors import InvalidBatchError, SkippyError


@attrs.frozen
class Segment:
    """Rows [start, stop) of a step, all of one sequence, in position order."""

    seq: int
    start: int
    stop: int
    output: bool  # the logits (and so a sample) of its last row are wanted

    @property
    def n_tokens(self) -> int:
        return self.stop - self.start


def segments(seq_ids: np.ndarray, outputs: np.ndarray) -> list[Segment]:
    """The step's maximal runs of one sequence. Only a run's last row may be an output row:
    the pipeline samples after a chunk, never inside one."""
    runs: list[Segment] = []
    n = len(seq_ids)
    start = 0
    for i in range(1, n + 1):
        if i == n or seq_ids[i] != seq_ids[start]:
            if outputs[start:i - 1].any():
                raise InvalidBatchError(f"sequence {int(seq_ids[start])}: an output row before the last row of its "
                                        "chunk; a pipeline samples only after a chunk's last token")
            runs.append(Segment(int(seq_ids[start]), start, i, bool(outputs[i - 1])))
            start = i
    return runs


def split_step(seq_ids: np.ndarray, outputs: np.ndarray, parts: int) -> list[list[Segment]]:
    """At most `parts` micro-batches of about equal token counts, rows kept in order; a long
    run (a prefill chunk) is cut between micro-batches, its output stays on its last piece."""
    if parts < 1:
        raise InvalidBatchError(f"parts must be >= 1, got {parts}")
    runs = segments(seq_ids, outputs)
    n = len(seq_ids)
    parts = min(parts, n)
    cuts = [round(n * k / parts) for k in range(1, parts)] + [n]
    batches: list[list[Segment]] = [[] for _ in range(parts)]
    part = 0
    for run in runs:
        start = run.start
        while start < run.stop:
            while cuts[part] <= start:
                part += 1
            stop = min(run.stop, cuts[part])
            batches[part].append(Segment(run.seq, start, stop, run.output and stop == run.stop))
            start = stop
    return [b for b in batches if b]


# Error codes that end a session (every stage frees what it held); any other Error answers one
# micro-batch, in its place in the order.
SESSION_ENDING = frozenset({"bad_hello", "bad_frame", "stage_lost", "stage_unreachable", "stage_failed"})


class NoLaneError(SkippyError):
    """A stage has no free sequence id for a new request: more sessions than it can hold."""


class UnknownRequestError(SkippyError):
    """Activations for a request this stage never opened (or already released)."""


class StageLanes:
    """A stage's own sequence ids: which request holds which. Stage 0 admits against the
    pipeline's ceiling, so a full stage means the ceiling was not respected: refuse, loudly."""

    def __init__(self, n_lanes: int) -> None:
        self._free = list(range(n_lanes - 1, -1, -1))
        self._held: dict[int, int] = {}

    def open(self, request_id: int) -> int:
        if request_id in self._held:
            return self._held[request_id]
        if not self._free:
            raise NoLaneError(f"request {request_id}: all {len(self._held)} lanes of this stage are held")
        seq = self._free.pop()
        self._held[request_id] = seq
        return seq

    def seq(self, request_id: int) -> int:
        try:
            return self._held[request_id]
        except KeyError:
            raise UnknownRequestError(f"request {request_id} is not open on this stage") from None

    def release(self, request_id: int) -> int | None:
        seq = self._held.pop(request_id, None)
        if seq is not None:
            self._free.append(seq)
        return seq

    def held(self) -> Iterator[tuple[int, int]]:
        return iter(list(self._held.items()))


@attrs.define
class _Slot:
    answer: list | None = None  # the frames to send up, once known


class ReplyOrder:
    """Answers go up in the order micro-batches came down, one per micro-batch.

    A stage before the last forwards a micro-batch and later relays the answer from below, but
    may also answer one itself (its own decode failed, so it never went down). `expect_below`
    and `answer_here` register micro-batches in arrival order; `from_below` gives the next
    answer from below to the oldest forwarded one; `ready` pops what can go up now."""

    def __init__(self) -> None:
        self._slots: list[_Slot] = []
        self._below: list[_Slot] = []

    def expect_below(self) -> None:
        slot = _Slot()
        self._slots.append(slot)
        self._below.append(slot)

    def answer_here(self, frames: list) -> None:
        self._slots.append(_Slot(list(frames)))

    def from_below(self, frames: list) -> None:
        if not self._below:
            raise InvalidBatchError("an answer came from below for no micro-batch sent down")
        self._below.pop(0).answer = list(frames)

    def ready(self) -> list:
        out: list = []
        while self._slots and self._slots[0].answer is not None:
            out += self._slots.pop(0).answer
        return out

    @property
    def pending(self) -> int:
        return len(self._slots)
