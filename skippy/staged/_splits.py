"""Which layers each stage holds, and how many sessions the whole pipeline can carry.

A stage is a contiguous layer range [begin, end) on its own node. Nodes differ in memory,
so layers are shared out in proportion to the room each node has; hybrid families also
constrain where a cut may fall. Pure functions: no trio, no llama.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..errors import InvalidInputError
from ..families import ARCH_CLASSES

Split = list[tuple[int, int]]


class SplitError(InvalidInputError):
    """No valid split exists for these inputs, or a given split is not a valid one."""


def validate_split(
    ranges: Sequence[tuple[int, int]], n_layer: int, allowed: Callable[[int], bool] | None = None
) -> None:
    """Raise SplitError unless ``ranges`` tile [0, n_layer) in order, each non-empty, cutting
    only where ``allowed(boundary)`` holds."""
    if not ranges:
        raise SplitError("a split needs at least one stage")
    expected = 0
    for i, (begin, end) in enumerate(ranges):
        if begin != expected:
            problem = "gap" if begin > expected else "overlap"
            raise SplitError(f"stage {i} starts at layer {begin}, previous stage ended at {expected}: {problem}")
        if end <= begin:
            raise SplitError(f"stage {i} [{begin}, {end}) holds no layers")
        if end > n_layer:
            raise SplitError(f"stage {i} [{begin}, {end}) ends past the model's {n_layer} layers")
        if end < n_layer and allowed is not None and not allowed(end):
            raise SplitError(f"stage {i} ends at layer {end}, where this family may not be cut")
        expected = end
    if expected != n_layer:
        raise SplitError(f"the stages cover layers [0, {expected}) of {n_layer}")


def plan_split(
    n_layer: int,
    budgets_bytes: Sequence[int],
    layer_bytes: int | Sequence[int],
    fixed_bytes: int | Sequence[int] = 0,
    allowed: Callable[[int], bool] | None = None,
) -> Split:
    """One contiguous layer range per stage, each within its stage's budget.

    Each stage's room is its budget less its fixed bytes (compute buffers, embeddings or
    output head, ...); layers are shared out in proportion to that room, so a weaker node
    gets fewer. Among the splits that fit and cut only at allowed boundaries, the one
    closest to proportional (least squared error) wins; ties give earlier stages more.
    """
    n_stages = len(budgets_bytes)
    per_layer = [layer_bytes] * n_layer if isinstance(layer_bytes, int) else list(layer_bytes)
    fixed = [fixed_bytes] * n_stages if isinstance(fixed_bytes, int) else list(fixed_bytes)
    if len(fixed) != n_stages:
        raise SplitError(f"fixed_bytes has {len(fixed)} entries for {n_stages} stages")
    room = [budget - f for budget, f in zip(budgets_bytes, fixed)]
    cuts = [b for b in range(1, n_layer) if allowed is None or allowed(b)]
    _check_plannable(n_layer, per_layer, room, cuts)

    prefix = [0]
    for size in per_layer:
        prefix.append(prefix[-1] + size)
    total, total_room = prefix[-1], sum(room)

    def cost(stage: int, begin: int, end: int) -> int | None:
        """Squared distance from the proportional share, scaled to stay in exact integers."""
        load = prefix[end] - prefix[begin]
        return None if load > room[stage] else (load * total_room - total * room[stage]) ** 2

    # best[b] = (cost, previous boundary) of the best split of layers [0, b) over the stages so far
    points = [0, *cuts, n_layer]
    best: dict[int, tuple[int, int]] = {b: (c, 0) for b in points[1:] if (c := cost(0, 0, b)) is not None}
    history = [best]
    for stage in range(1, n_stages):
        step: dict[int, tuple[int, int]] = {}
        for end in points[stage + 1 :]:
            for begin in reversed(points[stage:]):  # latest begin first: ties leave earlier stages bigger
                if begin >= end or begin not in best or (c := cost(stage, begin, end)) is None:
                    continue
                if end not in step or best[begin][0] + c < step[end][0]:
                    step[end] = (best[begin][0] + c, begin)
        best = step
        history.append(best)
    if n_layer not in best:
        raise SplitError(
            f"no split of {n_layer} layers into {n_stages} stages fits: layers cost {per_layer} bytes, "
            f"stages have {room} bytes of room, cuts allowed at {cuts}"
        )
    bounds = [n_layer]
    for level in reversed(history[1:]):
        bounds.append(level[bounds[-1]][1])
    bounds.append(0)
    bounds.reverse()
    return list(zip(bounds[:-1], bounds[1:]))


def _check_plannable(n_layer: int, per_layer: list[int], room: list[int], cuts: list[int]) -> None:
    """Name the common reasons a split cannot exist before searching for one."""
    n_stages = len(room)
    if n_stages == 0:
        raise SplitError("a split needs at least one stage budget")
    if len(per_layer) != n_layer:
        raise SplitError(f"layer_bytes has {len(per_layer)} entries for {n_layer} layers")
    if n_layer < n_stages:
        raise SplitError(f"{n_layer} layers cannot give each of {n_stages} stages at least one layer")
    for stage, r in enumerate(room):
        if r < min(per_layer):
            raise SplitError(f"stage {stage} has {r} bytes of room after fixed costs: not enough for any layer")
    if sum(per_layer) > sum(room):
        raise SplitError(f"the layers need {sum(per_layer)} bytes, the stages have {sum(room)} bytes of room")
    if len(cuts) < n_stages - 1:
        raise SplitError(f"{n_stages} stages need {n_stages - 1} cuts; only {len(cuts)} boundaries are allowed")


def even_split(n_layer: int, n_stages: int, allowed: Callable[[int], bool] | None = None) -> Split:
    """Stages of (nearly) equal layer counts, earlier stages taking the remainder."""
    return plan_split(n_layer, [n_layer] * n_stages, 1, allowed=allowed)


def balanced_split(
    layer_cost: Sequence[int], head_cost: int, n_stages: int, allowed: Callable[[int], bool] | None = None
) -> Split:
    """Stages of about equal compute, the output head counted on the last stage.

    A decode step through a pipeline goes at the pace of its slowest stage, and the head
    (n_vocab x n_embd) is often worth several layers (SmolLM2: 8 of its 30); an even split
    of the layers leaves the last stage the bottleneck. Costs are any additive measure
    (parameter counts in `layer_costs`)."""
    per_layer = list(layer_cost)
    share = -(-(sum(per_layer) + head_cost) // n_stages)
    error: SplitError | None = None
    for slack in range(1, len(per_layer) + 1):  # a share each, plus rounding slack where cuts are sparse
        budget = share + slack * max(per_layer)
        fixed = [0] * (n_stages - 1) + [min(head_cost, budget - min(per_layer))]
        try:
            return plan_split(len(per_layer), [budget] * n_stages, per_layer, fixed, allowed=allowed)
        except SplitError as exc:
            error = exc
    assert error is not None
    raise error


# -- family boundary rules and pinned splits

QWEN3NEXT_FULL_ATTENTION_INTERVAL = 2  # the synthetic model's; layer i is attention iff (i + 1) % interval == 0


def boundary_rule(
    family: str, *, full_attention_interval: int = QWEN3NEXT_FULL_ATTENTION_INTERVAL,
    recurrent_layers: Sequence[bool] | None = None,
) -> Callable[[int], bool]:
    """Where a family's model may be cut (a boundary b puts layer b first in its stage).

    qwen3next: only right after a full-attention layer, so every stage holds whole
    [recurrent..., attention] groups and so both memory components (per-sequence recurrent
    state and attention cells); its admission then counts the same kinds as its neighbours'.
    Which layers those are is the model's own: `recurrent_layers` (one flag per layer, as
    staged._layout reads them from the GGUF) when given, else every `full_attention_interval`-th.
    falcon-h1: every layer runs attention and a Mamba2 mixer side by side, so every layer
    boundary already leaves both memory kinds on each side: any cut is fine.
    Every other known family is attention-only per layer (dense, MLA, ISWA): any cut.
    """
    if family == "qwen3next":
        if recurrent_layers is not None:
            flags = tuple(recurrent_layers)
            return lambda boundary: 0 < boundary <= len(flags) and not flags[boundary - 1]
        if full_attention_interval < 1:
            raise SplitError(f"full_attention_interval must be >= 1, got {full_attention_interval}")
        return lambda boundary: boundary % full_attention_interval == 0
    if family in ARCH_CLASSES or family in PINNED_SPLITS:
        return lambda boundary: True
    raise SplitError(f"no boundary rule for family {family!r}")


# family -> (n_layer, {n_stages: ranges}). Deterministic topologies for multi-stage tests, so a
# planner change cannot silently move them. The synthetic families are their models' deep
# variants; smollm2 (SmolLM2-135M) and gemma3 (gemma-3-270m) are the real fetchable models.
_PINNED: dict[str, tuple[int, dict[int, tuple[tuple[int, int], ...]]]] = {
    "llama": (6, {2: ((0, 3), (3, 6)), 3: ((0, 2), (2, 4), (4, 6))}),
    # SWA on even layers, global on odd: every stage of two or more layers holds both kinds
    "gemma2": (6, {2: ((0, 3), (3, 6)), 3: ((0, 2), (2, 4), (4, 6))}),
    "deepseek2": (6, {2: ((0, 3), (3, 6)), 3: ((0, 2), (2, 4), (4, 6))}),
    "falcon-h1": (6, {2: ((0, 3), (3, 6)), 3: ((0, 2), (2, 4), (4, 6))}),
    # attention at layers 1, 3, 5, 7: cuts only at even boundaries
    "qwen3next": (8, {2: ((0, 4), (4, 8)), 3: ((0, 4), (4, 6), (6, 8))}),
    # dense architectures staged by patch 0007
    **{f: (6, {2: ((0, 3), (3, 6)), 3: ((0, 2), (2, 4), (4, 6))}) for f in ("qwen2", "qwen3", "qwen3moe", "phi3")},
    "smollm2": (30, {2: ((0, 15), (15, 30)), 3: ((0, 10), (10, 20), (20, 30))}),
    # global attention at layers 5, 11, 17: with 3 stages each holds exactly one
    "gemma3": (18, {2: ((0, 9), (9, 18)), 3: ((0, 6), (6, 12), (12, 18))}),
}
PINNED_SPLITS: dict[str, dict[int, tuple[tuple[int, int], ...]]] = {f: s for f, (_, s) in _PINNED.items()}
PINNED_N_LAYER: dict[str, int] = {f: n for f, (n, _) in _PINNED.items()}


def pipeline_ceiling(stage_ceilings: Sequence[Mapping[str, int]]) -> int:
    """How many sessions the pipeline can carry: every stage must hold every session in every
    memory component, so the weakest (stage, component) bounds them all."""
    if not stage_ceilings:
        raise InvalidInputError("pipeline_ceiling needs at least one stage")
    for stage, ceilings in enumerate(stage_ceilings):
        if not ceilings:
            raise InvalidInputError(f"stage {stage} reported no memory components")
        if any(c < 0 for c in ceilings.values()):
            raise InvalidInputError(f"stage {stage} reported a negative ceiling: {dict(ceilings)}")
    return min(min(ceilings.values()) for ceilings in stage_ceilings)
