"""The step token budget: how much prefill may join a step that carries decodes. Pure.

Every running stream waits for the step its next token is in, so a step's time is every
stream's inter-token latency. A long prompt chunk in a decode step freezes them all
(Sarathi-Serve's "generation stalls"). The budget keeps a mixed step within a latency
target: decodes always go (one token each), prefill fills what the target leaves, measured
from the steps this engine has run (an online least-squares fit of decode seconds against
the step's tokens). A step with no decodes stalls nobody and takes the whole n_batch;
a mixed step always gets at least `min_prefill` prompt tokens, so prompts keep moving
(TTFT stays bounded) however tight the target.
"""

from __future__ import annotations

import math
from collections import deque

import attrs

DEFAULT_STALL_FACTOR = 4.0  # with no target: a mixed step may cost up to this many decode-only steps
# ... and at most this share of a full n_batch step. Many streams make the decode-only step long (at
# B=32 on SmolLM2 4x of it is 0.6 s, a third of a full prefill step): the cap keeps a mixed step's
# stall a fraction of the one a server that fills n_batch with prefill imposes (llama-server's ITL p99
# is about 1.0-1.6 full steps). 0.3 gave ITL p99 0.33x of llama-server's at N=32 chat (steps overshoot
# the fit); a 300 ms target gave 0.19x at the same TTFT p99 (bench/results/frontier-n32).
FULL_STEP_SHARE = 0.2
MIN_SAMPLES = 8  # steps of distinct sizes seen before the fit is trusted
# A burst of arrivals may fill n_batch with prefill while streams decode (composer._burst), so each
# such step stalls every decoding stream past any target. Those stalls are the tail of the inter-token
# gaps: a burst stops once it has stalled this share of the tokens its running set has left to make.
BURST_STALL_SHARE = 0.01


@attrs.define
class StepCostModel:
    """seconds(tokens) = fixed + per_token * tokens, fitted over the last `window` steps.

    Running sums make observe and fit O(1): they run once per step on the hot path."""

    window: int = 256
    _samples: deque = attrs.field(init=False)
    _sums: list = attrs.field(init=False)  # n, sum x, sum y, sum x^2, sum x*y
    _evicted: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._samples = deque()
        self._sums = [0, 0.0, 0.0, 0.0, 0.0]
        self._evicted = 0

    def _add(self, x: float, y: float, sign: int) -> None:
        s = self._sums
        s[0] += sign
        s[1] += sign * x
        s[2] += sign * y
        s[3] += sign * x * x
        s[4] += sign * x * y

    def observe(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0 and math.isfinite(seconds):
            self._samples.append((n_tokens, seconds))
            self._add(n_tokens, seconds, 1)
            if len(self._samples) > self.window:
                self._add(*self._samples.popleft(), -1)
                self._evicted += 1
                if self._evicted % self.window == 0:  # start the sums afresh: no rounding drift over a long run
                    self._sums = [0, 0.0, 0.0, 0.0, 0.0]
                    for x, y in self._samples:
                        self._add(x, y, 1)

    def fit(self) -> tuple[float, float] | None:
        """(fixed, per_token) seconds, or None while the steps seen are too few or all one size."""
        n, sx, sy, sxx, sxy = self._sums
        if n < MIN_SAMPLES:
            return None
        var = n * sxx - sx * sx
        if var <= 1e-9 * max(1.0, n * sxx):  # all one size (up to rounding of the running sums)
            return None
        slope = (n * sxy - sx * sy) / var
        if slope <= 0:
            return None
        return max(0.0, (sy - slope * sx) / n), slope

    def seconds(self, n_tokens: int) -> float | None:
        f = self.fit()
        return None if f is None else f[0] + f[1] * n_tokens


@attrs.define
class TokenBudget:
    """How many prefill tokens a step with `n_decode` decode tokens may take.

    `target_s`: the step time a mixed step should stay within (a TPOT target); None derives it
    as DEFAULT_STALL_FACTOR x the cost of the decode-only step, capped at FULL_STEP_SHARE x the
    cost of a full n_batch step. `target_s = inf` turns the budget off (every step may fill
    n_batch, as before)."""

    n_batch: int
    target_s: float | None = None
    min_prefill: int = 32
    cost: StepCostModel = attrs.field(factory=StepCostModel)

    def observe(self, n_tokens: int, seconds: float) -> None:
        self.cost.observe(n_tokens, seconds)

    def prefill_tokens(self, n_decode: int) -> int:
        room = max(0, self.n_batch - n_decode)
        if n_decode == 0 or self.target_s == math.inf:
            return room
        fit = self.cost.fit()
        if fit is None:
            return room  # nothing measured yet: the first steps run as before
        fixed, per_token = fit
        if self.target_s is not None:
            target = self.target_s
        else:
            target = min(DEFAULT_STALL_FACTOR * (fixed + per_token * n_decode),
                         FULL_STEP_SHARE * (fixed + per_token * self.n_batch))
        allowed = math.floor((target - fixed) / per_token + 1e-6) - n_decode
        return min(room, max(self.min_prefill, allowed))
