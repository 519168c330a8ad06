"""Requests and the events they produce: plain data shared by the policies and the actors.

A Request is the one mutable record of a generation; exactly one actor owns it at a
time (admission while waiting, the composer while running), so no locking is needed.
Everything that crosses a channel as a message is frozen.
"""

from __future__ import annotations

import enum
from typing import Any, Literal, Sequence

import attrs
import numpy as np

from ..errors import EmptyPromptError, InvalidMaxTokensError, PromptTooLongError, SkippyError
from ..sampling import Sampler, SamplingParams

FinishReason = Literal["stop", "length", "cancelled", "error"]


class RequestState(enum.Enum):
    NEW = "new"  # created, its submission not yet taken by admission
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@attrs.frozen
class TokenEvent:
    """One sampled token (or, for cancel/error, none) and the text it completes.

    `text` may be empty while bytes of a split UTF-8 character or a possible stop
    string are held back; the final event flushes what is left.
    """

    token: int | None
    text: str
    index: int
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: SkippyError | None = None
    t_sampled: float = 0.0  # time.perf_counter() when its token was sampled (0: no token)
    # logprobs, on LogprobEvent only: plain class attributes here, so the common event costs nothing more
    logprob = None
    prompt_logprobs = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


@attrs.frozen
class LogprobEvent(TokenEvent):
    """The event of a request that asked for logprobs (scheduling.logprobs)."""

    logprob: Any = None  # its token's TokenLogprob (None: no token, e.g. max_tokens 0)
    # on its first event, when it scores its prompt: a TokenLogprob per prompt token after the first
    prompt_logprobs: tuple | None = None


@attrs.define(eq=False)
class Request:
    """A generation from submission to finish; `cached` counts its tokens in the KV memory."""

    id: int
    prompt: np.ndarray
    max_tokens: int
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    priority: int = 0  # lower is served first and preempted last (vLLM's meaning)
    stop: tuple[str, ...] = ()
    arrival: int = 0  # submission order: FCFS among equal priority
    state: RequestState = RequestState.NEW
    generated: list[int] = attrs.field(factory=list)
    seq_id: int | None = None
    cached: int = 0
    admitted_at: int = -1  # admission order, renewed on every (re)admission
    preemptions: int = 0
    pinned: bool = False  # preempted too often: never a victim again, admitted with a full reservation
    cancel_requested: bool = False
    ignore_eos: bool = False  # end-of-generation tokens do not finish it (benchmarks: exact lengths)
    # vLLM's fields: these sampled ids finish it too ("stop"; ignore_eos does not lift them); before
    # `min_tokens` tokens nothing finishes it but the length (its sampler cannot pick an end id, and no
    # stop string is looked for); `include_stop`: a stop string found stays in the text
    stop_ids: frozenset[int] = frozenset()
    min_tokens: int = 0
    include_stop: bool = False
    finish_reason: FinishReason | None = None
    share: Any = None  # a prefix.Share promised at admission, until its cells are copied in
    shared_tokens: int = 0  # prompt tokens of this admission shared from the prefix cache, not computed
    prefix_hashes: list[bytes] | None = attrs.field(default=None, repr=False)  # its prompt's block hashes
    pauses: set[int] = attrs.field(factory=set)  # prefill chunks end here (recurrent prefix snapshots)
    # logprobs (scheduling.logprobs): alternatives per sampled token (None: none asked; 0: the token's own only),
    # and for echo the prompt's tokens scored too (a request that scores its prompt never shares a prefix:
    # the rows of every prompt position must be computed)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    scored: int = 0  # prompt rows scored so far (kept across preemption: recomputed rows are not scored again)
    prompt_lp: list = attrs.field(factory=list, repr=False)
    # n > 1 (scheduling.forks): choice `choice` of a request whose first choice is `fork_of`; it shares the
    # prompt's cells once that one has computed them
    fork_of: "Request | None" = attrs.field(default=None, repr=False)
    choice: int = 0
    # latency targets (scheduling.slo), on the step scheduler's clock
    t_arrival: float = 0.0  # when it was submitted
    t_first: float | None = attrs.field(default=None, init=False)  # when its first token was routed
    deadline: float | None = attrs.field(default=None, init=False)  # when its first token is due
    late: bool = attrs.field(default=False, init=False)  # it can no longer meet a target: planned for last
    sampler: Sampler = attrs.field(init=False)
    assembler: Any = attrs.field(default=None, init=False)  # its TextAssembler, kept across preemption
    sink: Any = attrs.field(default=None, init=False, repr=False)  # where its events go (a trio channel)

    def __attrs_post_init__(self) -> None:
        self.sampler = Sampler(self.sampling, self.prompt)  # the prompt: the repetition penalty's window

    @property
    def n_tokens(self) -> int:
        """Prompt plus generated: what the KV memory must hold before the next sample."""
        return int(self.prompt.size) + len(self.generated)

    @property
    def pending(self) -> int:
        """Tokens not yet in the KV memory; 1 means the request is decoding."""
        return self.n_tokens - self.cached

    @property
    def held(self) -> int:
        """Tokens in memory, or promised there by a share not yet copied in."""
        return max(self.cached, self.share.length if self.share is not None else 0)

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.generated)

    def token_slice(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of prompt + generated, without concatenating in the common cases."""
        p = int(self.prompt.size)
        if stop <= p:
            return self.prompt[start:stop]
        gen = np.asarray(self.generated, dtype=np.int32)
        if start >= p:
            return gen[start - p : stop - p]
        return np.concatenate((self.prompt[start:], gen[: stop - p]))

    @property
    def usage(self) -> Usage:
        return Usage(prompt_tokens=int(self.prompt.size), completion_tokens=len(self.generated),
                     cached_tokens=self.shared_tokens)


def cancelled_event(request: Request) -> TokenEvent:
    """The final event of a request cancelled before it finished."""
    return TokenEvent(None, "", len(request.generated), "cancelled", request.usage)


def validate(prompt: Sequence[int] | np.ndarray, max_tokens: int, n_ctx: int, n_vocab: int,
             scoring: bool = False) -> np.ndarray:
    """Named errors for what can never run; returns the prompt as int32. `scoring` (the prompt's logprobs
    are asked) allows max_tokens 0: the prompt is scored, nothing generated."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < (0 if scoring else 1):
        raise InvalidMaxTokensError(f"max_tokens must be a positive integer (0 only when scoring the prompt), "
                                    f"got {max_tokens!r}")
    tokens = np.asarray(prompt)
    if tokens.size == 0:
        raise EmptyPromptError("prompt is empty")
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise EmptyPromptError("prompt must be text or a 1-D sequence of token ids") from None
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        from ..errors import InvalidInputError

        raise InvalidInputError(f"prompt token ids must lie in [0, {n_vocab})")
    if tokens.size + max_tokens > n_ctx:
        raise PromptTooLongError(f"prompt ({tokens.size}) + max_tokens ({max_tokens}) exceed the context ({n_ctx})")
    return tokens.astype(np.int32, copy=False)


def check_ends(min_tokens: Any, stop_token_ids: Any, max_tokens: int, n_vocab: int) -> frozenset[int]:
    """vLLM's min_tokens and stop_token_ids, checked (named errors); returns the stop ids as a set."""
    from ..errors import InvalidInputError

    if isinstance(min_tokens, bool) or not isinstance(min_tokens, (int, np.integer)) or not 0 <= min_tokens <= max_tokens:
        raise InvalidInputError(f"min_tokens must be an integer in [0, max_tokens={max_tokens}], got {min_tokens!r}")
    if isinstance(stop_token_ids, (str, bytes)) or not hasattr(stop_token_ids, "__iter__"):
        raise InvalidInputError(f"stop_token_ids must be a sequence of token ids, got {stop_token_ids!r}")
    ids = list(stop_token_ids)
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < n_vocab for t in ids):
        raise InvalidInputError(f"stop_token_ids must be token ids in [0, {n_vocab}), got {ids!r}")
    return frozenset(int(t) for t in ids)
