"""Per-request token sampling. Each request owns its RNG, so its draws never depend on its batch-mates."""

from __future__ import annotations

import math

import attrs
import numpy as np

from .errors import InvalidInputError


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidInputError(message)


@attrs.frozen
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __attrs_post_init__(self) -> None:
        _check(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0,
               f"temperature must be a finite number >= 0, got {self.temperature!r}")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}")
        _check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(isinstance(self.min_p, (int, float)) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        _check(self.seed is None or isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0,
               f"seed must be an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Stateful only through its RNG: the same params, seed and logits give the same tokens."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params or SamplingParams()
        self._rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        return pick(logits, self.params, self.draw())

    def draw(self) -> float | None:
        """The uniform number the next sample uses (None when greedy, which draws nothing).

        Split from `pick` so a pipeline's last stage can sample with the draw stage 0 made:
        the same RNG stream and arithmetic as one process, whichever stage holds the logits."""
        return None if self.params.greedy else float(self._rng.random())

    def state(self) -> dict:
        """Where its RNG stream stands: a step that failed puts it back (`restore`), drawing nothing."""
        return self._rng.bit_generator.state

    def restore(self, state: dict) -> None:
        self._rng.bit_generator.state = state


def pick(logits: np.ndarray, p: SamplingParams, u: float | None) -> int:
    """The token `p` picks from `logits` with the uniform draw `u` (unused when greedy)."""
    if p.greedy:
        return int(np.argmax(logits))
    if u is None or not 0.0 <= u < 1.0:
        raise InvalidInputError(f"a non-greedy sample needs a draw in [0, 1), got {u!r}")
    scaled = logits.astype(np.float64) / p.temperature
    candidates = np.arange(scaled.shape[0])
    if p.top_k and p.top_k < scaled.shape[0]:
        candidates = np.argpartition(-scaled, p.top_k - 1)[: p.top_k]
    # a stable order (by logit, then id) keeps draws reproducible across numpy versions
    candidates = candidates[np.lexsort((candidates, -scaled[candidates]))]
    weights = np.exp(scaled[candidates] - scaled[candidates[0]])
    probs = weights / weights.sum()
    keep = np.ones(probs.shape[0], dtype=bool)
    if p.min_p > 0:
        keep &= probs >= p.min_p * probs[0]
    if p.top_p < 1:
        before = np.cumsum(probs) - probs
        keep &= before < p.top_p
    keep[0] = True
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    index = int(np.searchsorted(np.cumsum(probs), u * 1.0, side="right"))
    return int(candidates[min(index, probs.shape[0] - 1)])
