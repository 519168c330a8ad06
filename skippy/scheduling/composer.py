"""The running set and step composition: pure, no trio, no llama.

A step is one decode token for every running sequence first, then prefill chunks
for the others in admission order, under the token budget. So a long prompt is
chunked across steps and never stalls the sequences that are already decoding.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from ..errors import SkippyError
from .budget import BURST_STALL_SHARE, TokenBudget
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
        return StepPlan(chunks, np.empty_like(self.tokens), self.positions + 1, self.seq_ids, self.outputs, 0,
                        self.rows)


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
    def __init__(self, n_batch: int, budget: TokenBudget | None = None) -> None:
        self.n_batch = n_batch
        self.budget = budget
        self.running: list[Request] = []  # admission order
        self.n_logprobs = 0  # running requests that asked for logprobs: a step builds LogitRows only then
        self.burst_stalls = 0  # decode tokens the current burst's full-batch steps have held back

    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            assert r.seq_id is not None and r.state is RequestState.RUNNING
            if r.assembler is None:
                r.assembler = TextAssembler(r.stop)
            self.running.append(r)
            self.n_logprobs += asks_logprobs(r)

    def remove(self, request: Request) -> None:
        self.running.remove(request)
        self.n_logprobs -= asks_logprobs(request)

    def compose(self, cell_budget: int | None = None) -> StepPlan:
        """Decode tokens first, then prefill chunks in admission order, within the cell budget, n_batch
        and the token budget (how much prefill may join a step that carries decodes).

        A request still waiting for a shared prefix to be copied in is left out."""
        budget = self.n_batch if cell_budget is None else min(self.n_batch, cell_budget)
        decoding = [r for r in self.running if r.pending == 1 and r.share is None]
        fit = decoding[: max(budget, 0)]
        chunks = [Chunk(r, r.cached, 1, True, True) for r in fit]
        left = budget - len(fit)
        if self.budget is not None and fit and not self._burst(len(fit)):
            left = min(left, self.budget.prefill_tokens(len(fit)))
        for r in self.running:
            if left <= 0:
                break
            if r.pending > 1 and r.share is None:
                n = min(r.pending, left, _to_next_pause(r))
                chunks.append(Chunk(r, r.cached, n, n == r.pending, False))
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
        return StepPlan(tuple(chunks), tok, pos, seq, out, len(decoding) - n_dec, rows)

    def _burst(self, n_decoding: int) -> bool:
        """At least as many requests wait for their first token as streams decode (a burst of
        arrivals): TTFT is the experience of half the running set or more, so the step fills n_batch
        with prefill. A prompt whose last token is all that is left (pending 1, it rides in the
        decode rows) still waits for its first token; and equality counts, so a wave of 2k prompts
        whose first k started finishes together instead of staggering into mixed steps (at N=8 gen
        the stagger made later arrivals join decode steps: ITL p99 2.4x llama-server's).

        Every stream decoding in such a step waits for all of it: one long inter-token gap each.
        The burst goes on only while those gaps stay within BURST_STALL_SHARE of the tokens the
        running set has left to generate, so they stay in the tail past the p99 of the gaps;
        after that the budget bounds every step again."""
        prompts = streams = 0  # one pass: this runs every step that carries decodes
        for r in self.running:
            if r.generated:
                streams += 1
            elif r.share is None:
                prompts += 1
        if not prompts or prompts < streams:
            self.burst_stalls = 0  # the burst is over: the next one has its own allowance
            return False
        allowance = BURST_STALL_SHARE * sum(max(0, r.remaining) for r in self.running)
        if self.burst_stalls + n_decoding > allowance:
            return False
        self.burst_stalls += n_decoding
        return True

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
            tok, piece, end = int(tokens[row]), pieces[row], bool(eog[row]) and not r.ignore_eos
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
            tok, piece, end = int(tokens[row]), pieces[row], bool(eog[row]) and not r.ignore_eos
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
        return r.assembler.flush(), "stop"
    text, stopped = r.assembler.push(piece)
    if stopped:
        return text, "stop"
    if r.remaining <= 0:
        return text + r.assembler.flush(), "length"
    return text, None
