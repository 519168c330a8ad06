"""What a step costs: predicted from its shape, calibrated online from the steps that ran. Pure.

A step's wall time on a CPU is close to additive in what it computes (bench/results/step-shape):
a fixed cost (the weights streamed once), a cost per decode row (the output projection and
sampling), a cost per prompt token, and the attention over the cells each row attends to, which
grows with the context. Recurrent families add a state copy per sequence computed for the first
time, and a ubatch per distinct chunk length: llama.cpp splits a batch over recurrent memory into
equal-length ubatches (decode rows are one token each, so a prompt chunk beside them is a second
ubatch, and every ubatch streams the weights again; about 20 ms each on falcon-h1, a two-core box).
So the model is linear in those features, fitted by exponentially weighted least squares:

    A <- decay * A + x x^T,  b <- decay * b + x y,  theta = (A + ridge I)^-1 (b + ridge theta0)

`decay` forgets old steps (about 1 / (1 - decay) steps of memory), so the model follows a
machine that slows down mid-run; the ridge pulls every direction the recent steps did not
excite back to the prior `theta0` (a steady decode run never varies the prompt tokens, and plain
recursive least squares would forget what it knew of them). The prior comes from a probe at
open, or from the first steps. Each update and solve is on fixed-size arrays (one per feature):
O(1) per step. Predictions are never negative, and the marginal costs the budget divides by are
never below a floor: a bad fit can make the budget cautious, never make it divide by zero.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

FEATURES = ("fixed", "decode_rows", "prefill_tokens", "attended_kcells", "new_states", "splits")
N_FEATURES = len(FEATURES)
DECAY = 0.98  # ~50 steps of memory
RIDGE = 0.5  # weight of the prior, in steps' worth of evidence
MIN_SAMPLES = 8  # steps seen before the model counts as calibrated
MIN_PER_TOKEN_S = 1e-6  # the floor of a marginal cost (1 us per token: no machine is faster here)


@attrs.frozen
class StepShape:
    """What a step computes: decode rows, prompt tokens, thousands of cells attended (summed over
    every row of every attention component), sequences whose state is set up for the first time, and
    ubatches beyond the first (`splits`: only over recurrent memory, see `equal_splits`)."""

    decode_rows: int = 0
    prefill_tokens: int = 0
    attended_kcells: float = 0.0
    new_states: int = 0
    splits: int = 0

    def features(self) -> np.ndarray:
        return np.array((1.0, self.decode_rows, self.prefill_tokens, self.attended_kcells, self.new_states,
                         self.splits))

    @property
    def tokens(self) -> int:
        return self.decode_rows + self.prefill_tokens


def equal_splits(lengths) -> int:
    """Ubatches beyond the first that llama.cpp's equal-length split makes of a batch whose sequences bring
    these token counts (a decode row 1): each ubatch takes as many tokens from every sequence left as
    the shortest has, so there is one per distinct count."""
    return max(0, len(set(lengths)) - 1)


def attended_kcells(start: int, n: int) -> float:
    """Cells a chunk of `n` tokens from position `start` attends to, summed over its rows, in thousands:
    row i attends start + i + 1 cells."""
    return n * (start + (n + 1) / 2) / 1000.0


@attrs.define
class StepCostModel:
    """seconds(shape) = theta . features(shape), kept calibrated by `observe`."""

    decay: float = DECAY
    ridge: float = RIDGE
    prior: np.ndarray = attrs.field(factory=lambda: np.array((0.0, 1e-3, 1e-3, 0.0, 0.0, 0.0)))
    samples: int = 0
    _a: np.ndarray = attrs.field(init=False)
    _b: np.ndarray = attrs.field(init=False)
    _theta: np.ndarray | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.prior = np.asarray(self.prior, dtype=float)
        self._a = np.zeros((N_FEATURES, N_FEATURES))
        self._b = np.zeros(N_FEATURES)

    @property
    def calibrated(self) -> bool:
        return self.samples >= MIN_SAMPLES

    def set_prior(self, theta: np.ndarray) -> None:
        """A new prior (e.g. the probe at open): every direction without recent evidence returns to it."""
        self.prior = np.maximum(np.asarray(theta, dtype=float), 0.0)
        self._theta = None

    def observe(self, shape: StepShape, seconds: float) -> None:
        if shape.tokens <= 0 or not (seconds > 0 and math.isfinite(seconds)):
            return  # an empty step or nonsense is not evidence
        x = shape.features()
        self._a *= self.decay
        self._b *= self.decay
        self._a += np.outer(x, x)
        self._b += x * seconds
        self.samples += 1
        self._theta = None

    def theta(self) -> np.ndarray:
        """The coefficients, each >= 0 (a negative cost per row is a misfit of noise, not a machine)."""
        if self._theta is None:
            lhs = self._a + self.ridge * np.eye(N_FEATURES)
            rhs = self._b + self.ridge * self.prior
            try:
                theta = np.linalg.solve(lhs, rhs)
            except np.linalg.LinAlgError:
                theta = self.prior.copy()
            if not np.all(np.isfinite(theta)):
                theta = self.prior.copy()
            self._theta = np.maximum(theta, 0.0)
        return self._theta

    def seconds(self, shape: StepShape) -> float:
        return max(0.0, float(self.theta() @ shape.features()))

    def per_decode_row(self, kcells: float = 0.0) -> float:
        """The marginal cost of one more decode row that attends `kcells` thousand cells. In decode steps rows
        and cells grow together, so the fit may put a row's cost in either coefficient (served on falcon-h1
        it drifted to 0 s a row and 24 ms a thousand cells): only the two together are a row's cost."""
        t = self.theta()
        return max(MIN_PER_TOKEN_S, float(t[1] + t[3] * kcells))

    def split_seconds(self) -> float:
        """What one more ubatch in a step costs (0 where steps are never split: nothing taught it)."""
        return max(0.0, float(self.theta()[5]))

    def per_prefill_token(self, start: int = 0) -> float:
        """The marginal cost of one more prompt token at about position `start`."""
        t = self.theta()
        return max(MIN_PER_TOKEN_S, float(t[2] + t[3] * (start + 1) / 1000.0))

    def prefill_seconds(self, n_tokens: int, start: int = 0) -> float:
        """A prompt computed alone, in one step."""
        return self.seconds(StepShape(0, n_tokens, attended_kcells(start, n_tokens), 1))

    def prefill_for(self, seconds: float, base: StepShape, start: int = 0, split: bool = False) -> int:
        """The most prompt tokens (from position about `start`) that a step of `base` can take and stay
        within `seconds`; 0 when `base` alone already costs that much. `split`: the chunk is a ubatch of its
        own (over recurrent memory, beside decode rows), which costs what a split does."""
        left = seconds - self.seconds(base) - (self.split_seconds() if split else 0.0)
        if left <= 0:
            return 0
        return int(left / self.per_prefill_token(start))
