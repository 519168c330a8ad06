"""Per-request token sampling. Each request owns its RNG and its token history, so its draws never
depend on its batch-mates.

Order, as llama.cpp's sampler chain: logit_bias, then the repetition penalty (llama.cpp's
repeat_penalty over the last `repeat_last_n` tokens of prompt + output), then OpenAI's presence
and frequency penalties (over this request's generated tokens), then DRY (skippy._dry, over the
last `dry_penalty_last_n` of prompt + output), then top-k, temperature, top-p and min-p (both on
the same weights) and the draw (see `pick`); or, with mirostat 1 or 2, temperature and mirostat."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import attrs
import numpy as np

from . import _dry
from .errors import InvalidInputError


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidInputError(message)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) and math.isfinite(v)


def _bias_pairs(value: Mapping[Any, float] | Iterable[tuple[int, float]] | None) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs: hashable, and one order whatever the input's."""
    if not value:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    pairs: dict[int, float] = {}
    for item in items:
        _check(isinstance(item, (tuple, list)) and len(item) == 2, f"logit_bias entries are (token, bias), got {item!r}")
        token, bias = item
        _check(_is_int(token) and token >= 0, f"logit_bias token ids must be integers >= 0, got {token!r}")
        _check(_is_num(bias) or bias == -math.inf, f"logit_bias values must be finite numbers (or -inf), got {bias!r}")
        pairs[int(token)] = float(bias)
    return tuple(sorted(pairs.items()))


def _breaker_pairs(value: Iterable[tuple[int, Sequence[int]]] | None) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """dry_breakers as sorted (head, tail) pairs of ints: hashable, one order."""
    if value is None:
        return None
    try:
        return tuple(sorted((int(h), tuple(int(t) for t in tail)) for h, tail in value))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"dry_breakers are (head token, tail tokens) pairs, got {value!r}") from e


@attrs.frozen
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0  # locally typical sampling (llama.cpp's typ_p); 1 = off
    xtc_probability: float = 0.0  # llama.cpp's XTC ("exclude top choices"): how often it cuts; 0 = off
    xtc_threshold: float = 0.1  # the probability from which a choice is "top" (above 0.5: never cuts)
    mirostat: int = 0  # 1 or 2: llama.cpp's mirostat v1 / v2 in place of top-k/top-p/min-p/typical/XTC; 0 = off
    mirostat_tau: float = 5.0  # the target surprise (bits)
    mirostat_eta: float = 0.1  # how fast mu follows it
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI's: minus this once for every token already generated
    frequency_penalty: float = 0.0  # OpenAI's: minus this per time a token was generated
    repeat_penalty: float = 1.0  # llama.cpp's: logits of recent tokens divided (> 0) or multiplied (<= 0); 1 = off
    repeat_last_n: int = 64  # the window of prompt + output it looks at; 0 = off, -1 = all of it
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_bias_pairs)
    # llama.cpp's DRY (skippy._dry): on when dry_multiplier != 0 (and dry_penalty_last_n != 0)
    dry_multiplier: float = 0.0
    dry_base: float = 1.75  # >= 1
    dry_allowed_length: int = 2  # repeats longer than this are penalized
    dry_penalty_last_n: int = 64  # the window of prompt + output it scans; 0 = off, -1 = all of it
    dry_sequence_breakers: tuple[str, ...] = attrs.field(default=_dry.DEFAULT_BREAKERS, converter=tuple)
    # the breakers as (head token, tail tokens) pairs over the model's vocabulary: Engine fills it in
    # (skippy._dry.breaker_table); None until then, and a Sampler refuses DRY breakers unresolved
    dry_breakers: tuple[tuple[int, tuple[int, ...]], ...] | None = attrs.field(default=None, converter=_breaker_pairs)
    # derived once: `greedy` is read per row per step
    _shapes: bool = attrs.field(init=False, default=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _check(_is_num(self.temperature) and self.temperature >= 0,
               f"temperature must be a finite number >= 0, got {self.temperature!r}")
        _check(_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}")
        _check(_is_num(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(_is_num(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        _check(_is_num(self.typical_p) and 0 < self.typical_p <= 1,
               f"typical_p must be in (0, 1], got {self.typical_p!r}")
        _check(self.mirostat in (0, 1, 2) and _is_int(self.mirostat),
               f"mirostat must be 0 (off), 1 (mirostat) or 2 (mirostat 2.0), got {self.mirostat!r}")
        for name in ("mirostat_tau", "mirostat_eta"):
            _check(_is_num(getattr(self, name)) and getattr(self, name) >= 0,
                   f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        for name in ("xtc_probability", "xtc_threshold"):
            _check(_is_num(getattr(self, name)) and 0 <= getattr(self, name) <= 1,
                   f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        _check(self.seed is None or _is_int(self.seed) and self.seed >= 0,
               f"seed must be an integer >= 0, got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            _check(_is_num(getattr(self, name)), f"{name} must be a finite number, got {getattr(self, name)!r}")
        _check(_is_num(self.repeat_penalty) and self.repeat_penalty > 0,
               f"repeat_penalty must be a finite number > 0, got {self.repeat_penalty!r}")
        _check(_is_int(self.repeat_last_n) and self.repeat_last_n >= -1,
               f"repeat_last_n must be an integer >= -1, got {self.repeat_last_n!r}")
        _check(_is_num(self.dry_multiplier) and self.dry_multiplier >= 0,
               f"dry_multiplier must be a finite number >= 0, got {self.dry_multiplier!r}")
        _check(_is_num(self.dry_base) and self.dry_base >= 1, f"dry_base must be a finite number >= 1, got {self.dry_base!r}")
        _check(_is_int(self.dry_allowed_length) and self.dry_allowed_length >= 0,
               f"dry_allowed_length must be an integer >= 0, got {self.dry_allowed_length!r}")
        _check(_is_int(self.dry_penalty_last_n) and self.dry_penalty_last_n >= -1,
               f"dry_penalty_last_n must be an integer >= -1, got {self.dry_penalty_last_n!r}")
        _check(all(isinstance(b, str) for b in self.dry_sequence_breakers),
               f"dry_sequence_breakers must be strings, got {self.dry_sequence_breakers!r}")
        # under mirostat llama.cpp's chain is logit_bias, temperature, mirostat: no penalty, no DRY
        object.__setattr__(self, "_shapes", bool(self.logit_bias or self.penalizes))

    @property
    def penalizes(self) -> bool:
        """Whether a penalty or DRY reshapes the logits (never under mirostat, as in llama.cpp)."""
        return not self.mirostat and bool(self.presence_penalty or self.frequency_penalty or self.dry
                                          or (self.repeat_penalty != 1 and self.repeat_last_n != 0))

    @property
    def dry(self) -> bool:
        """Whether DRY shapes the logits."""
        return _dry.enabled(self.dry_multiplier, self.dry_base, self.dry_penalty_last_n)

    @property
    def needs_breakers(self) -> bool:
        """DRY is on with breaker strings not yet resolved over a vocabulary (Engine does it)."""
        return self.dry and bool(self.dry_sequence_breakers) and self.dry_breakers is None

    @property
    def shapes_logits(self) -> bool:
        """Whether a penalty or bias changes the logits before the pick (needs the request's history)."""
        return self._shapes

    @property
    def greedy(self) -> bool:
        """The token is the raw logits' argmax: no temperature, nothing shaping them, nothing drawn
        (such rows are sampled in one vectorised argmax)."""
        return self.temperature == 0 and not self._shapes


class Sampler:
    """Stateful through its RNG and the tokens it picked: the same params, seed, prompt and logits
    give the same tokens. `state()`/`restore()` cover both (a failed step draws nothing)."""

    def __init__(self, params: SamplingParams | None = None, prompt: Sequence[int] | np.ndarray = ()) -> None:
        self.params = params or SamplingParams()
        self._rng = np.random.default_rng(self.params.seed)
        self._shapes = self.params.shapes_logits
        self._prompt = np.asarray(prompt, dtype=np.int64).ravel() if self._shapes else np.empty(0, np.int64)
        self._out: list[int] = []  # what it picked, in order (kept only when shaping needs it)
        bias = self.params.logit_bias
        self._bias_ids = np.array([t for t, _ in bias], dtype=np.int64)
        self._bias = np.array([b for _, b in bias], dtype=np.float64)
        # a grammar (skippy.constrain.Constraint): masks the row after shaping, advances once per pick
        self.constraint: Any = None
        # vLLM's min_tokens: these ids (end-of-generation, stop_token_ids) cannot be picked while
        # fewer than `_hold_until` tokens have been (`hold_ends`)
        self._hold_ids = np.empty(0, np.int64)
        self._hold_until = 0
        self._n = 0  # picks so far
        self._mu = 2.0 * self.params.mirostat_tau  # mirostat's running bound on surprise (llama.cpp's start)
        if self.params.needs_breakers:
            raise InvalidInputError("DRY's sequence breakers need the model's vocabulary: sample through Engine, "
                                    "or set dry_breakers (skippy._dry.breaker_table, table_pairs)")
        self._dry_table = _dry.pairs_table(self.params.dry_breakers or ())

    def hold_ends(self, ids: Sequence[int] | np.ndarray, until: int) -> None:
        """Mask `ids` out of the first `until` picks (their logits -inf; the other logits untouched)."""
        self._hold_ids = np.asarray(ids, dtype=np.int64).ravel()
        self._hold_until = int(until) if self._hold_ids.size else 0

    @property
    def greedy(self) -> bool:
        """Sampled in sample_rows' vectorised argmax: greedy params, no grammar, no ids held out."""
        return self.params.greedy and self.constraint is None and self._n >= self._hold_until

    def __call__(self, logits: np.ndarray) -> int:
        holding = self._n < self._hold_until
        self._n += 1
        if self.constraint is not None:
            return self._constrained(logits, holding)
        if not self._shapes:
            return self._pick(self._held_out(logits, copy=True) if holding else logits)
        shaped = self.shape(logits)
        token = self._pick(self._held_out(shaped, copy=False) if holding else shaped)
        self._out.append(token)
        return token

    def _pick(self, logits: np.ndarray) -> int:
        if not self.params.mirostat or self.params.temperature == 0:
            return pick(logits, self.params, *self.draws())
        mirostat = mirostat_v2 if self.params.mirostat == 2 else mirostat_v1
        token, self._mu = mirostat(logits, self.params, self.draw(), self._mu)
        return token

    def _held_out(self, logits: np.ndarray, *, copy: bool) -> np.ndarray:
        """The row with the held ids at -inf, in its own dtype (the others' values and so their order
        are the row's own: a greedy pick that was not a held id is unchanged)."""
        x = np.array(logits) if copy else logits
        ids = self._hold_ids[self._hold_ids < x.shape[0]]
        x[ids] = -np.inf
        return x

    def _constrained(self, logits: np.ndarray, holding: bool = False) -> int:
        """The grammar's mask over the shaped logits, then the pick; the grammar takes the token."""
        c = self.constraint
        row = self.shape(logits) if self._shapes else logits
        if holding:
            row = self._held_out(row, copy=not self._shapes)
        token = self._pick(c.mask(row))
        c.accept(token)
        if self._shapes:
            self._out.append(token)
        return token

    def shape(self, logits: np.ndarray) -> np.ndarray:
        """The logits after logit_bias and the penalties and DRY (none of those under mirostat, as
        llama.cpp's chain), for this request's history (a float64 copy)."""
        p = self.params
        x = np.array(logits, dtype=np.float64)
        n = x.shape[0]
        if self._bias_ids.size:
            ok = self._bias_ids < n
            x[self._bias_ids[ok]] += self._bias[ok]
        if not p.penalizes:
            return x
        if p.repeat_penalty != 1 and p.repeat_last_n != 0:
            ids = self._recent(p.repeat_last_n)
            ids = ids[ids < n]
            x[ids] = np.where(x[ids] <= 0, x[ids] * p.repeat_penalty, x[ids] / p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self._out:
            ids, counts = np.unique(np.asarray(self._out, dtype=np.int64), return_counts=True)
            keep = ids < n
            x[ids[keep]] -= counts[keep] * p.frequency_penalty + p.presence_penalty
        if p.dry:
            window = self._window(p.dry_penalty_last_n)
            for token, penalty in _dry.dry_penalties(window.tolist(), self._dry_table, p.dry_multiplier, p.dry_base,
                                                     p.dry_allowed_length).items():
                if token < n:
                    x[token] -= penalty
        return x

    def _window(self, last_n: int) -> np.ndarray:
        """The last `last_n` tokens of prompt + output, in order (-1: all)."""
        out = np.asarray(self._out, dtype=np.int64)
        if last_n < 0:
            return np.concatenate((self._prompt, out))
        if out.size >= last_n:
            return out[out.size - last_n:]
        return np.concatenate((self._prompt[max(0, self._prompt.size - (last_n - out.size)):], out))

    def _recent(self, last_n: int) -> np.ndarray:
        """The distinct tokens among the last `last_n` of prompt + output (-1: all)."""
        return np.unique(self._window(last_n))

    def draw(self) -> float | None:
        """The uniform number the next sample uses (None at temperature 0, which draws nothing).

        Split from `pick` so a pipeline's last stage can sample with the draw stage 0 made:
        the same RNG stream and arithmetic as one process, whichever stage holds the logits."""
        return None if self.params.temperature == 0 else float(self._rng.random())

    def draws(self) -> tuple[float | None, float | None]:
        """(the pick's draw, XTC's): XTC's, when it is on, is the next number of the same stream."""
        u = self.draw()
        xtc = self.params.xtc_probability > 0 and u is not None
        return u, float(self._rng.random()) if xtc else None

    def state(self) -> tuple:
        """Where its RNG stream and history (and grammar) stand: a step that failed puts them back (`restore`)."""
        grammar = self.constraint.state() if self.constraint is not None else None
        return self._rng.bit_generator.state, len(self._out), self._n, self._mu, grammar

    def restore(self, state: tuple) -> None:
        rng, n_out, self._n, self._mu, grammar = state
        self._rng.bit_generator.state = rng
        del self._out[n_out:]
        if grammar is not None and self.constraint is not None:
            self.constraint.restore(grammar)


# Top-p needs the candidates best first, but only as far as its cut: the order is sorted a head at a
# time (the best 256, then 2048, 16384, then all), not all 49k-256k ids per token (a two-key sort of
# SmolLM2's 49152 ids took 3.6-4.3 ms against a 7 ms decode, bench/results/sampling-cost).
HEADS = (256, 2048, 16384)
# The draw's running sum goes a block of ids at a time: one sum per block, then a running sum over the
# blocks and within the one block the draw lands in (a running sum over 49k float64s took 0.5 ms).
BLOCK = 1024


def pick(logits: np.ndarray, p: SamplingParams, u: float | None, u_xtc: float | None = None) -> int:
    """The token `p` picks from `logits` (already shaped) with the uniform draw `u` (unused at temperature 0).

    In float32, llama.cpp's precision. The candidates are the top-k (ties at the cut to the lower
    ids), else every id; each weighs exp((x - max) / temperature). Min-p keeps those weighing at
    least min_p (the best weighs 1); top-p keeps, best first (by logit, then id), those whose
    predecessors' weight is under top_p of the candidates' total; typical_p, before both, keeps the
    locally typical ones (`_typical_kept`), and top-p and min-p then weigh only those; XTC, last,
    drops all but the least likely of the choices above its threshold when its draw `u_xtc` falls
    within xtc_probability (`_xtc_kept`). The draw walks what is kept in id
    order, as llama.cpp's dist sampler does: the first whose cumulative weight exceeds u x their
    total (summed a BLOCK at a time, see `_draw`). Nothing is sorted unless top-p asks for it, and
    then only as far as its cut."""
    if p.temperature == 0 or np.float32(p.temperature) == 0:  # under float32's least (1.4e-45): its limit
        return int(np.argmax(logits))
    if u is None or not 0.0 <= u < 1.0:
        raise InvalidInputError(f"a non-greedy sample needs a draw in [0, 1), got {u!r}")
    x = np.asarray(logits, dtype=np.float32)
    ids = top_k_ids(x, p.top_k) if 0 < p.top_k < x.shape[0] else None  # ascending: id order
    if ids is not None:
        x = x[ids]
    w = x - x.max()
    with np.errstate(over="ignore"):  # a tiny temperature sends every weight but the best's to -inf: 0, its limit
        w /= np.float32(p.temperature)
    np.exp(w, out=w)
    kept = None  # local indices, ascending; None: every candidate
    if p.typical_p < 1:
        kept = _typical_kept(w, p.typical_p)
    if p.top_p < 1:
        kept = _top_p_kept(x, w, p.top_p) if kept is None else kept[_top_p_kept(x[kept], w[kept], p.top_p)]
    if p.min_p > 0:  # relative to the best kept (weighing exp(0) = 1 unless typical_p dropped it): it stays
        if kept is None:
            kept = np.flatnonzero(w >= np.float32(p.min_p))
        else:
            kept = kept[w[kept] >= np.float32(p.min_p) * w[kept].max()]
    if u_xtc is not None and u_xtc <= p.xtc_probability and p.xtc_threshold <= 0.5:
        kept = _xtc_kept(x, w, np.arange(w.size) if kept is None else kept, p.xtc_threshold)
    index = _draw(w if kept is None else w[kept], u)
    local = index if kept is None else int(kept[index])
    return local if ids is None else int(ids[local])


def _draw(w: np.ndarray, u: float) -> int:
    """The first index whose cumulative weight exceeds u x the total. The total is the running sum of
    the blocks' sums (BLOCK weights each, the last maybe fewer); the cumulative weight inside the block
    it lands in is the blocks before it plus a running sum from the block's start (float64 throughout)."""
    n_full = w.size // BLOCK
    sums = w[: n_full * BLOCK].reshape(n_full, BLOCK).sum(axis=1, dtype=np.float64)
    if w.size > n_full * BLOCK:
        sums = np.append(sums, w[n_full * BLOCK:].sum(dtype=np.float64))
    edges = np.cumsum(sums)
    target = u * edges[-1]
    b = min(int(np.searchsorted(edges, target, side="right")), edges.size - 1)
    within = np.cumsum(w[b * BLOCK: (b + 1) * BLOCK], dtype=np.float64)
    if b:
        within += edges[b - 1]
    return b * BLOCK + min(int(np.searchsorted(within, target, side="right")), within.size - 1)


def mirostat_v2(logits: np.ndarray, p: SamplingParams, u: float, mu: float) -> tuple[int, float]:
    """llama.cpp's mirostat v2 after its temperature (llama_sampler_mirostat_v2_apply): of the
    softmax, the candidates whose surprise -log2 p is at most `mu` (at least the likeliest), drawn
    from renormalized (in id order, as `pick` draws); then mu -= eta x (the drawn one's surprise
    there - tau). Returns (token, the next mu). float32 as llama.cpp, the sums float64."""
    x = np.asarray(logits, dtype=np.float32) / np.float32(p.temperature)
    w = np.exp(x - x.max())
    prob = (w / w.sum(dtype=np.float64)).astype(np.float32)
    with np.errstate(divide="ignore"):
        kept = np.flatnonzero(-np.log2(prob) <= np.float32(mu))
    if kept.size == 0:
        kept = np.array([int(np.argmax(x))])
    index = _draw(w[kept], u)
    renorm = np.float32(w[kept[index]] / w[kept].sum(dtype=np.float64))
    surprise = float(-np.log2(renorm))
    return int(kept[index]), float(np.float32(mu - p.mirostat_eta * (surprise - p.mirostat_tau)))


MIROSTAT_M = 100  # the candidates mirostat v1 estimates its Zipf exponent from (llama-server's m)


def mirostat_v1(logits: np.ndarray, p: SamplingParams, u: float, mu: float) -> tuple[int, float]:
    """llama.cpp's mirostat (v1) after its temperature (llama_sampler_mirostat_apply, m = 100): the
    softmax best first; the Zipf exponent s estimated from the best m probabilities; k = ((s - 1) 2^mu
    / (1 - n^(1 - s)))^(1/s) (`mirostat_k`); the best max(k, 1) drawn from renormalized (in id order,
    as `pick` draws); then mu -= eta x (the drawn one's surprise there - tau). float32 and sums in
    llama.cpp's order, so k is llama.cpp's. Returns (token, the next mu)."""
    x = np.asarray(logits, dtype=np.float32) / np.float32(p.temperature)
    order = best_first(x, x.size)
    prob = softmax_best_first(x[order])
    k = mirostat_k(prob, mu, x.size, MIROSTAT_M)
    kept = np.sort(order[:k])
    w = np.exp(x[kept] - x[order[0]])
    index = _draw(w, u)
    token = int(kept[index])
    rank = int(np.flatnonzero(order[:k] == token)[0])  # its place best first
    return token, mirostat_mu(softmax_best_first(x[order[:k]]), rank, mu, p)


def softmax_best_first(xs: np.ndarray) -> np.ndarray:
    """llama_sampler_softmax_impl on logits best first: exp(x - the first), over their float32 running sum."""
    w = np.exp(xs - xs[0])
    return w / np.cumsum(w, dtype=np.float32)[-1]


def mirostat_k(prob: np.ndarray, mu: float, n_vocab: int, m: int = 100) -> int:
    """How many candidates mirostat v1 keeps, from the probabilities best first (float32 scalars, as
    llama.cpp). A k that is NaN or past int32 is 1, as x86 converts it (then max(k, 1))."""
    f = np.float32
    ti_bi, ti_sq = f(0), f(0)
    for i in range(min(m - 1, prob.size - 1)):
        t = np.log(f(f(i + 2) / f(i + 1)))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.log(f(prob[i] / prob[i + 1]))
        ti_bi = f(ti_bi + f(t * b))
        ti_sq = f(ti_sq + f(t * t))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s_hat = f(ti_bi / ti_sq)
        eps = f(s_hat - f(1))
        k = np.power(f(f(eps * np.power(f(2), f(mu))) / f(f(1) - np.power(f(n_vocab), -eps))), f(f(1) / s_hat))
    size = int(k) if np.isfinite(k) and -2.0 ** 31 < k < 2.0 ** 31 else -2 ** 31
    return min(max(size, 1), prob.size)


def mirostat_mu(prob: np.ndarray, index: int, mu: float, p: SamplingParams) -> float:
    """mu after drawing the `index`-th best of the kept (their renormalized probabilities `prob`)."""
    f = np.float32
    surprise = f(-np.log2(f(prob[index])))
    return float(f(f(mu) - f(f(p.mirostat_eta) * f(surprise - f(p.mirostat_tau)))))


def _xtc_kept(x: np.ndarray, w: np.ndarray, kept: np.ndarray, threshold: float) -> np.ndarray:
    """llama.cpp's XTC cut (min_keep 1): of the kept candidates whose probability is at least
    `threshold`, all but the least likely leave, when there are two or more (the one that stays:
    the last of them best first, by logit then id)."""
    prob = w[kept] / w[kept].sum(dtype=np.float64)
    top = np.flatnonzero(prob >= np.float32(threshold))
    if top.size < 2:
        return kept
    order = top[np.lexsort((kept[top], -x[kept[top]]))]  # best first among the top choices
    return np.delete(kept, order[:-1])


def _typical_kept(w: np.ndarray, typical_p: float) -> np.ndarray:
    """Local indices (ascending) that locally typical sampling keeps (llama.cpp's
    llama_sampler_typical_apply, min_keep 1): the candidates by |-log p - H| ascending (H the
    entropy; ties to the lower id), up to and with the first at which their probability sum
    exceeds typical_p. One sort over the candidates: a cost only requests that ask for it pay."""
    prob = w / w.sum(dtype=np.float64)
    with np.errstate(divide="ignore"):
        logp = np.log(prob)
    live = prob > 0
    entropy = -float(np.dot(prob[live], logp[live]))
    shifted = np.where(live, np.abs(-logp - entropy), np.inf)
    order = np.argsort(shifted, kind="stable")
    total = np.cumsum(prob[order])
    cut = min(1 + int(np.searchsorted(total, typical_p, side="right")), order.size)
    return np.sort(order[:cut])


def _top_p_kept(x: np.ndarray, w: np.ndarray, top_p: float) -> np.ndarray:
    """Local indices (ascending) of the best-first prefix whose predecessors weigh under top_p of the total."""
    limit = top_p * w.sum(dtype=np.float64)
    for size in (*(h for h in HEADS if h < x.size), x.size):
        head = best_first(x, size)
        total = np.cumsum(w[head], dtype=np.float64)
        # the first whose predecessors' weight reaches the limit (the best has none, so it stays)
        cut = 1 + int(np.searchsorted(total[:-1], limit, side="left"))
        if cut < head.size or size >= x.size:
            return np.sort(head[:cut])
    raise AssertionError("unreachable: the last head is every candidate")


def top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k best logits (0 < k < len), ties at the cut going to the lower ids, in ascending id
    order: a partition by value (np.partition, 5-10x faster than argpartition on 49k ids) and two scans."""
    kth = np.partition(x, x.shape[0] - k)[x.shape[0] - k]
    above = np.flatnonzero(x > kth)
    return np.sort(np.concatenate((above, np.flatnonzero(x == kth)[: k - above.size])))


def best_first(x: np.ndarray, size: int) -> np.ndarray:
    """Indices of at least the `size` largest of float32 `x` (all of a tie at the cut), by value then index:
    one sort of unique 64-bit keys (the float's bits made order-preserving, inverted for descending, above
    the index), 5x faster than numpy's two-key lexsort."""
    idx = np.arange(x.size) if size >= x.size else np.flatnonzero(x >= np.partition(x, x.size - size)[x.size - size])
    bits = (x[idx] + np.float32(0)).view(np.uint32)  # + 0: -0.0 becomes 0.0, which compares equal to it
    ordered = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))
    keys = ((~ordered).astype(np.uint64) << np.uint64(32)) | idx.astype(np.uint64)
    return (np.sort(keys) & np.uint64(0xFFFFFFFF)).astype(np.intp)
