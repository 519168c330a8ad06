"""DRY ("don't repeat yourself"), llama.cpp's repetition sampler (llama_sampler_dry, from koboldcpp),
ported as pure functions so a request's penalties depend only on its own history. Pure.

Two parts, as in llama.cpp:
- `breaker_table`: each sequence-breaker string turned into (head token, tail tokens) restart
  sequences over the model's vocabulary (get_overlapping_token_sequences): once per breaker list;
  the engine caches it.
- `dry_penalties`: per step, the penalty of each token that would extend a repeat of at least
  `allowed_length` tokens within the last `penalty_last_n` tokens of prompt + output
  (llama_sampler_dry_apply: the restart-sequence limit, the reverse Z-algorithm, the penalty
  multiplier x base ^ (length - allowed_length), its exponent clamped against float overflow).
The loops mirror llama.cpp's, quirks included, so the penalties are the same numbers."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

DEFAULT_BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's common_params_sampling.dry_sequence_breakers
MAX_CHAR_LEN = 40  # llama_sampler_init_dry truncates a breaker to this many bytes
MAX_SEQ_LEN = 20  # and a restart sequence's tail to this many tokens
FLOAT_MAX_LOG = np.float32(88.7228391)  # ~log(FLT_MAX): the exponent's clamp

Table = Mapping[int, tuple[tuple[int, ...], ...]]  # head token -> its tails (() for a one-token breaker)


def breaker_table(pieces: Sequence[bytes], tokenize: Callable[[bytes], Iterable[int]],
                  breakers: Iterable[str]) -> dict[int, tuple[tuple[int, ...], ...]]:
    """Restart sequences: a token whose text holds a breaker is a breaker alone (tail ()); a token
    whose text ends with the start of one is its head, the rest of the breaker tokenized its tail.
    `pieces[t]` is token t's text as llama.cpp's detokenize({t}, special=true) gives it, `tokenize`
    llama.cpp's tokenize(text, add_special=false, parse_special=false)."""
    table: dict[int, list[tuple[int, ...]]] = {}

    def add(token: int, tail: tuple[int, ...]) -> None:
        tails = table.setdefault(token, [])
        if tail not in tails:
            tails.append(tail)

    for text in breakers:
        brk = text.encode("utf-8")[:MAX_CHAR_LEN]
        if not brk:
            continue
        head = brk[:1]
        for token, word in enumerate(pieces):
            if brk in word:
                add(token, ())
                continue
            pos = word.find(head)
            while pos != -1:
                i, match = 1, True
                while i < len(brk) and i + pos < len(word):
                    if word[pos + i] != brk[i]:
                        match = False
                        break
                    i += 1
                if match:
                    add(token, tuple(int(t) for t in tokenize(brk[i:]))[:MAX_SEQ_LEN])
                pos = word.find(head, pos + 1)
    return {t: tuple(tails) for t, tails in table.items()}


def table_pairs(table: Table) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The table as sorted (head, tail) pairs: hashable, one order (SamplingParams keeps this)."""
    return tuple(sorted((int(h), tuple(int(x) for x in tail)) for h, tails in table.items() for tail in tails))


def pairs_table(pairs: Iterable[tuple[int, Sequence[int]]]) -> dict[int, tuple[tuple[int, ...], ...]]:
    out: dict[int, list[tuple[int, ...]]] = {}
    for head, tail in pairs:
        out.setdefault(int(head), []).append(tuple(tail))
    return {h: tuple(t) for h, t in out.items()}


def enabled(multiplier: float, base: float, last_n: int) -> bool:
    """llama.cpp's test: DRY does nothing unless all three are set."""
    return multiplier != 0 and base >= 1 and last_n != 0


def dry_penalties(window: Sequence[int], table: Table, multiplier: float, base: float,
                  allowed_length: int) -> dict[int, float]:
    """token -> the amount its logit goes down, from `window` (the last penalty_last_n tokens of the
    history, oldest first)."""
    n = len(window)
    if n <= allowed_length:
        return {}
    rat = window[::-1]  # rat[i]: i tokens back from the newest (llama.cpp's ring_buffer::rat)

    # step 1: the nearest restart sequence limits how long a repeat can be
    rep_limit = n
    for i in range(n):
        tails = table.get(rat[i])
        if tails is None:
            continue
        longest = -1
        for tail in tails:
            size = len(tail)
            if longest < size <= i and all(tail[o] == rat[i - o - 1] for o in range(size)):
                longest = size
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed_length:
        return {}

    # step 2: the reverse Z-algorithm: counts[last - k] = how far the suffix repeats k tokens back
    counts = [0] * n
    last, lt, rt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat[m] == rat[m + k]:
                m += 1
            counts[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p = k - lt
            if counts[last - p] < rt - k + 1:
                counts[last - k] = min(counts[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat[i] == rat[i - k]:
                    i += 1
                counts[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1

    # step 3: the token after each repeat would extend it; keep each token's longest
    longest_for: dict[int, int] = {}
    for i in range(n - 1):
        length = counts[i]
        if length >= allowed_length:
            token = rat[n - 2 - i]
            if longest_for.get(token, -1) < length:
                longest_for[token] = length

    # step 4: multiplier x base ^ (length - allowed), the exponent clamped (float32, as llama.cpp)
    b32, m32 = np.float32(base), np.float32(multiplier)
    max_exponent = int(FLOAT_MAX_LOG / np.float32(math.log(b32))) if b32 > np.float32(1.000001) else 0
    out: dict[int, float] = {}
    for token, length in longest_for.items():
        if () in table.get(token, ()):
            continue  # a one-token breaker is never penalized
        exponent = length - allowed_length
        if max_exponent > 0 and exponent > max_exponent:
            exponent = max_exponent
        out[token] = float(np.float32(float(m32) * math.pow(float(b32), exponent)))
    return out
