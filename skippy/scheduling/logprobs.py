"""Log-probabilities of logits rows, for the requests that ask (OpenAI's `logprobs`, and `echo` scoring a
prompt). Pure numpy: no trio, no llama.

They are the log-softmax of the raw logits row a token was sampled from (or, for a prompt token, the row
of the position before it): before logit_bias, the penalties and temperature, as vLLM returns them by
default. A step builds a `LogitRows` only when one of its requests asked (None otherwise: every output
row is sampled, nothing else is computed), and the runtime computes them on the worker thread right
after the decode, while the rows are still there (`row_logprobs`).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from ..sampling import best_first

MAX_TOP = 20  # alternatives per token (OpenAI's limit)
_BLOCK = 32  # rows at a time: a 1024-token prompt's rows never need one big temporary


@attrs.frozen
class TokenLogprob:
    """A token's log-probability under its row, and the row's `k` most likely tokens (most likely first,
    ties by lower id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@attrs.frozen(eq=False)
class LogitRows:
    """Which output rows of a step are sampled and which score prompt tokens (only for a step in which a
    request asked for logprobs)."""

    sample: np.ndarray  # the row of each sampled output, in sampler order
    sample_top: tuple[int, ...]  # per sampled row: alternatives wanted (-1: no logprobs for it)
    score: np.ndarray  # rows that score a prompt token (the position before it)
    score_tokens: np.ndarray  # the prompt token each of them scores
    score_top: tuple[int, ...]
    per_chunk: tuple[int, ...]  # score rows per chunk of the plan, in chunk order

    @property
    def n_rows(self) -> int:
        return int(self.sample.size + self.score.size)


@attrs.frozen
class RowLogprobs:
    """What a step computed: per sampled row (None where not asked), then the scored prompt rows in order."""

    sampled: tuple[TokenLogprob | None, ...]
    scored: tuple[TokenLogprob, ...]


def row_logprobs(logits: np.ndarray, rows: np.ndarray, tokens: Sequence[int], tops: Sequence[int]) -> list[TokenLogprob]:
    """TokenLogprob of `tokens[j]` under logits row `rows[j]`, with `tops[j]` alternatives. The same row
    bytes give the same result bytes (fixed-order reductions), so batch-invariant logits give
    batch-invariant logprobs."""
    out: list[TokenLogprob] = []
    for start in range(0, len(rows), _BLOCK):
        x = np.array(logits[rows[start : start + _BLOCK]], dtype=np.float32)
        x -= x.max(axis=1, keepdims=True)
        lse = np.log(np.exp(x).sum(axis=1, dtype=np.float64))
        for j in range(x.shape[0]):
            xj, norm = x[j], float(lse[j])
            token, k = int(tokens[start + j]), int(tops[start + j])
            top: tuple[tuple[int, float], ...] = ()
            if k > 0:
                cand = best_first(xj, k)[:k]  # by logprob, then id
                top = tuple((int(c), float(xj[c]) - norm) for c in cand)
            out.append(TokenLogprob(token, float(xj[token]) - norm, top))
    return out


def compute(logits: np.ndarray, rows: LogitRows, sampled: np.ndarray) -> RowLogprobs:
    """A step's logprobs: the sampled tokens' (where asked) and the scored prompt tokens'."""
    want = [j for j, k in enumerate(rows.sample_top) if k >= 0]
    got = row_logprobs(logits, rows.sample[want], [int(sampled[j]) for j in want],
                       [rows.sample_top[j] for j in want])
    per_row: list[TokenLogprob | None] = [None] * len(rows.sample_top)
    for j, lp in zip(want, got):
        per_row[j] = lp
    scored = row_logprobs(logits, rows.score, rows.score_tokens, rows.score_top) if rows.score.size else []
    return RowLogprobs(tuple(per_row), tuple(scored))


def plan_rows(chunks: Sequence, outputs: np.ndarray) -> LogitRows:
    """The rows of a step whose requests asked for logprobs; marks the scored prompt positions in
    `outputs` (a prompt row p scores token p + 1; rows already scored before a preemption are not again)."""
    sample_pos: list[int] = []
    sample_top: list[int] = []
    score_pos: list[int] = []
    score_tok: list[np.ndarray] = []
    score_top: list[int] = []
    per_chunk: list[int] = []
    offset = 0
    for c in chunks:
        r = c.request
        k = 0
        if r.prompt_logprobs is not None:
            lo = max(c.start, r.scored)
            hi = min(c.start + c.n, int(r.prompt.size) - 1)
            if hi > lo:
                k = hi - lo
                outputs[offset + lo - c.start : offset + hi - c.start] = 1
                score_pos.extend(range(offset + lo - c.start, offset + hi - c.start))
                score_tok.append(r.prompt[lo + 1 : hi + 1])
                score_top.extend([r.prompt_logprobs] * k)
        per_chunk.append(k)
        if c.output:
            sample_pos.append(offset + c.n - 1)
            sample_top.append(-1 if r.logprobs is None else r.logprobs)
        offset += c.n
    row_of = np.cumsum(outputs, dtype=np.int64) - 1
    return LogitRows(
        sample=row_of[np.asarray(sample_pos, dtype=np.int64)], sample_top=tuple(sample_top),
        score=row_of[np.asarray(score_pos, dtype=np.int64)],
        score_tokens=np.concatenate(score_tok) if score_tok else np.empty(0, np.int32),
        score_top=tuple(score_top), per_chunk=tuple(per_chunk))
