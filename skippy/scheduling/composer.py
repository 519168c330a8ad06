"""The running set and step composition: pure, no trio, no llama.

A step is one decode token for every running sequence first (late ones only as far
as on-time work leaves time: scheduling.budget), then prefill chunks for the others,
under the token budget. So a long prompt is chunked across steps and never stalls the
sequences that are already decoding.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import numpy as np

from ..errors import SkippyError
from .budget import TokenBudget
from .cost import StepShape, attended_kcells, equal_splits
from .logprobs import LogitRows, RowLogprobs, plan_rows
from .requests import FinishReason, LogprobEvent, Request, RequestState, TokenEvent
from .text import TextAssembler


@attrs.frozen
class Chunk:
    request: Request
    start: int  # position of its first token
    n: int
    output: bool  # its last token's logits are sampled
    decode: bool


@attrs.frozen
class StepPlan:
    chunks: tuple[Chunk, ...]
    tokens: np.ndarray
    positions: np.ndarray
    seq_ids: np.ndarray
    outputs: np.ndarray
    starved: int  # decoding sequences that did not fit the budget: pressure
    rows: LogitRows | None = None  # only when a request of the step asked for logprobs (see scheduling.logprobs)
    shape: StepShape | None = None  # what the step computes, for the cost model (scheduling.cost)
    yielded: int = 0  # late streams left out for on-time work this step (scheduling.budget.TokenBudget.rows)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def n_decode(self) -> int:
        return sum(1 for c in self.chunks if c.decode)

    @property
    def n_prefill(self) -> int:
        return sum(c.n for c in self.chunks if not c.decode)

    @property
    def mixed(self) -> bool:
        return self.n_decode > 0 and self.n_prefill > 0

    @property
    def new_sequences(self) -> int:
        """Sequences this step computes for the first time (each takes a recurrent slot of its own:
        one that shared a state gets its own copy at its first decode)."""
        return sum(1 for c in self.chunks if c.start == c.request.shared_tokens)

    @property
    def output_requests(self) -> list[Request]:
        """Requests of the logits rows, in row order."""
        return [c.request for c in self.chunks if c.output]

    @property
    def all_decode(self) -> bool:
        return all(c.decode for c in self.chunks)

    def advanced(self) -> "StepPlan":
        """The decode step after this all-decode one, for the same sequences in the same order: each
        one position on. Its tokens are what this step samples (filled in when it is launched chained)."""
        assert self.all_decode
        chunks = tuple(Chunk(c.request, c.start + 1, 1, True, True) for c in self.chunks)
        # seq_ids, outputs and rows are the same and nothing writes a plan's arrays after composing
        # it (a chained launch fills only its tokens), so they are shared, not copied: this runs
        # on the event loop every decode step
        shape = self.shape
        if shape is not None:
            shape = StepShape(shape.decode_rows, 0, shape.attended_kcells + shape.decode_rows / 1000.0, 0)
        return StepPlan(chunks, np.empty_like(self.tokens), self.positions + 1, self.seq_ids, self.outputs, 0,
                        self.rows, shape, self.yielded)


def prefill_order(r: Request) -> tuple:
    """Which prompt goes first in a step's prefill: on-time before late, then priority (lower first),
    then the first-token deadline (least slack), then admission order."""
    return (r.late, r.priority, r.deadline if r.deadline is not None else math.inf, r.admitted_at)


def asks_logprobs(r: Request) -> bool:
    return r.logprobs is not None or r.prompt_logprobs is not None


def _to_next_pause(r: Request) -> int:
    """Tokens until the next point where its prefill must stop (a recurrent snapshot is taken there)."""
    ahead = [p - r.cached for p in r.pauses if p > r.cached]
    return min(ahead) if ahead else r.pending


@attrs.frozen
class Emitted:
    request: Request
    event: TokenEvent


class Composer:
    def __init__(self, n_batch: int, budget: TokenBudget | None = None, equal_split: bool = False) -> None:
        self.n_batch = n_batch
        self.budget = budget
        # recurrent memory: llama.cpp splits a batch into equal-length ubatches (scheduling.cost.equal_splits),
        # so beside decode rows prompt chunks go in one length, the first's: each other length is a ubatch more
        self.equal_split = equal_split
        self.running: list[Request] = []  # admission order
        self.n_logprobs = 0  # running requests that asked for logprobs: a step builds LogitRows only then

    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            assert r.seq_id is not None and r.state is RequestState.RUNNING
            if r.assembler is None:
                r.assembler = TextAssembler(r.stop, r.include_stop)
            self.running.append(r)
            self.n_logprobs += asks_logprobs(r)

    def remove(self, request: Request) -> None:
        self.running.remove(request)
        self.n_logprobs -= asks_logprobs(request)

    def compose(self, cell_budget: int | None = None, now: float = 0.0) -> StepPlan:
        """Decode tokens first, then prefill chunks (on-time prompts before late ones, by priority, then
        first-token deadline, then admission), within the cell budget, n_batch and the token budget (how
        much prefill may join a step that carries decodes, scheduling.budget).

        A request still waiting for a shared prefix to be copied in is left out."""
        budget = self.n_batch if cell_budget is None else min(self.n_batch, cell_budget)
        decoding = []
        prefilling = []
        for r in self.running:
            if r.share is None:
                if r.pending == 1:
                    decoding.append(r)
                elif r.pending > 1:
                    prefilling.append(r)
        if len(prefilling) > 1:
            prefilling.sort(key=prefill_order)
        kept = self.budget.rows(decoding, prefilling, now) if self.budget is not None else decoding
        fit = kept[: max(budget, 0)]
        chunks = [Chunk(r, r.cached, 1, True, True) for r in fit]
        left = budget - len(fit)
        if self.budget is not None and fit and prefilling:
            on_time = any(not r.late for r in prefilling)
            left = min(left, self.budget.prefill_tokens(fit, now, on_time, prefilling[0].cached,
                                                        split=self.equal_split,
                                                        prompts=sum(r.cached + r.pending for r in prefilling)))
        kcells = sum(r.cached + 1 for r in fit) / 1000.0
        joined = 0  # beside decode rows over recurrent memory: the one chunk length of this step's ubatch
        for r in prefilling:
            if left <= 0:
                break
            n = min(r.pending, left, _to_next_pause(r))
            if self.equal_split and fit:
                if not joined:
                    joined = n
                elif n < joined:
                    continue  # shorter: a ubatch of its own; a later prompt may still fit the length
                else:
                    n = joined
            chunks.append(Chunk(r, r.cached, n, n == r.pending, False))
            kcells += attended_kcells(r.cached, n)
            left -= n
        n_dec = len(fit)
        tok = np.empty(sum(c.n for c in chunks), dtype=np.int32)
        pos = np.empty_like(tok)
        seq = np.empty_like(tok)
        out = np.zeros(tok.size, dtype=np.int8)
        if n_dec:
            tok[:n_dec] = [r.generated[-1] if r.generated else int(r.prompt[-1]) for r in fit]
            pos[:n_dec] = [r.cached for r in fit]
            seq[:n_dec] = [r.seq_id for r in fit]
            out[:n_dec] = 1
        i = n_dec
        for c in chunks[n_dec:]:
            r = c.request
            tok[i : i + c.n] = r.token_slice(c.start, c.start + c.n)
            pos[i : i + c.n] = np.arange(c.start, c.start + c.n)
            seq[i : i + c.n] = r.seq_id
            out[i + c.n - 1] = c.output
            i += c.n
        rows = plan_rows(chunks, out) if self.n_logprobs else None
        new = sum(1 for c in chunks if c.start == c.request.shared_tokens)
        splits = equal_splits([c.n for c in chunks]) if self.equal_split else 0
        shape = StepShape(n_dec, int(tok.size) - n_dec, kcells, new, splits)
        return StepPlan(tuple(chunks), tok, pos, seq, out, len(kept) - n_dec, rows, shape, len(decoding) - len(kept))

    def apply(
        self, plan: StepPlan, tokens: Sequence[int], pieces: Sequence[bytes], eog: Sequence[bool],
        t_sampled: float = 0.0, logprobs: RowLogprobs | None = None,
    ) -> tuple[list[Emitted], list[Request]]:
        """Account a finished step: advance caches, route sampled tokens, detect finishes."""
        if plan.rows is not None:
            return self._apply_rows(plan, tokens, pieces, eog, t_sampled, logprobs)
        events: list[Emitted] = []
        finished: list[Request] = []
        row = 0
        for c in plan.chunks:
            r = c.request
            r.cached += c.n
            if not c.output:
                continue
            tok, piece = int(tokens[row]), pieces[row]
            end = bool(eog[row]) and not r.ignore_eos or tok in r.stop_ids
            row += 1
            if r.cancel_requested or r.state is not RequestState.RUNNING:
                continue  # swept before the next step
            r.generated.append(tok)
            index = len(r.generated) - 1
            text, reason = _text_and_finish(r, piece, end)
            if reason is not None:
                self._finish(r, reason)
                finished.append(r)
                events.append(Emitted(r, TokenEvent(tok, text, index, reason, r.usage, t_sampled=t_sampled)))
            else:
                events.append(Emitted(r, TokenEvent(tok, text, index, t_sampled=t_sampled)))
        return events, finished

    def _apply_rows(
        self, plan: StepPlan, tokens: Sequence[int], pieces: Sequence[bytes], eog: Sequence[bool], t_sampled: float,
        logprobs: RowLogprobs | None,
    ) -> tuple[list[Emitted], list[Request]]:
        """`apply` for a step in which some request asked for logprobs: the same routing, plus each sampled
        token's logprobs on its event, the scored prompt rows kept on the request until its first event,
        and a request that only scores its prompt (max_tokens 0) finished once the prompt is in."""
        assert logprobs is not None and plan.rows is not None
        events: list[Emitted] = []
        finished: list[Request] = []
        row = s = 0
        for c, k in zip(plan.chunks, plan.rows.per_chunk):
            r = c.request
            r.cached += c.n
            if k:
                r.prompt_lp.extend(logprobs.scored[s : s + k])
                r.scored += k
                s += k
            if not c.output:
                continue
            tok, piece = int(tokens[row]), pieces[row]
            end = bool(eog[row]) and not r.ignore_eos or tok in r.stop_ids
            lp = logprobs.sampled[row]
            row += 1
            if r.cancel_requested or r.state is not RequestState.RUNNING:
                continue
            prompt_lp = tuple(r.prompt_lp) if r.prompt_logprobs is not None and not r.generated else None
            if r.max_tokens == 0:  # scoring only: the prompt is in, nothing is generated
                self._finish(r, "length")
                finished.append(r)
                events.append(Emitted(r, LogprobEvent(None, "", 0, "length", r.usage, prompt_logprobs=prompt_lp)))
                continue
            r.generated.append(tok)
            index = len(r.generated) - 1
            text, reason = _text_and_finish(r, piece, end)
            if reason is not None:
                self._finish(r, reason)
                finished.append(r)
            events.append(Emitted(r, LogprobEvent(tok, text, index, reason, r.usage if reason else None,
                                                  t_sampled=t_sampled, logprob=lp, prompt_logprobs=prompt_lp)))
        return events, finished

    def _finish(self, r: Request, reason: FinishReason) -> None:
        self.running.remove(r)
        self.n_logprobs -= asks_logprobs(r)
        r.finish_reason = reason
        r.state = RequestState.CANCELLED if reason == "cancelled" else RequestState.FINISHED

    def end(self, r: Request, reason: FinishReason, error: SkippyError | None = None) -> Emitted:
        """Finish a running request without a token (cancelled or failed)."""
        self._finish(r, reason)
        return Emitted(r, TokenEvent(None, "", len(r.generated), reason, r.usage, error))

    def cancelled(self) -> list[Request]:
        return [r for r in self.running if r.cancel_requested]


def _text_and_finish(r: Request, piece: bytes, end: bool) -> tuple[str, FinishReason | None]:
    """The text a request's newest token (already in `generated`) releases, and why it ends, if it does."""
    if end:
        if r.include_stop and r.generated[-1] in r.stop_ids:  # vLLM keeps a stop id's text with include_stop
            return r.assembler.push(piece, check=False)[0] + r.assembler.flush(), "stop"
        return r.assembler.flush(), "stop"
    text, stopped = r.assembler.push(piece, check=len(r.generated) >= r.min_tokens)
    if stopped:
        return text, "stop"
    if r.remaining <= 0:
        return text + r.assembler.flush(), "length"
    return text, None
