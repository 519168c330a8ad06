"""Each stage's lane plan on its own node, and the pipeline's ceiling: derived, not configured.

A stage holds only its layers (patch 0006), so its weights and its bytes per KV cell are its
share of the model's; what a node has left after its weights sizes that stage's lanes. The
pipeline carries the fewest sessions any stage can: the weakest node bounds it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

import attrs

from .._plan import plan_for
from ..native import Model
from ..scheduling.lanes import LanePlan, PlanError
from ._splits import pipeline_ceiling

_BLOCK = re.compile(r"blk\.(\d+)\.")


@attrs.frozen
class StagePlan:
    layers: tuple[int, int]
    node_bytes: int  # the node's memory for this stage: weights + KV + recurrent state
    weight_bytes: int
    lanes: LanePlan


@attrs.frozen
class PipelinePlan:
    stages: tuple[StagePlan, ...]

    @property
    def ceiling(self) -> int:
        return pipeline_ceiling([{stage.lanes.reason: stage.lanes.ceiling} for stage in self.stages])

    @property
    def bounding_stage(self) -> int:
        """Which stage sets the ceiling (the first, where several do)."""
        return min(range(len(self.stages)), key=lambda i: self.stages[i].lanes.ceiling)


def layer_costs(path: os.PathLike[str] | str) -> tuple[list[int], int]:
    """Parameters per layer and in the output head (the token embedding when tied), read from
    the GGUF's tensor table: a compute proxy for balanced_split, with no weights loaded."""
    from ..native._gguf_header import read_header

    per_layer: dict[int, int] = {}
    named = {}
    for tensor in read_header(path).tensors:
        match = _BLOCK.match(tensor.name)
        if match:
            per_layer[int(match.group(1))] = per_layer.get(int(match.group(1)), 0) + tensor.n_elements
        else:
            named[tensor.name] = tensor.n_elements
    head = named.get("output.weight", named.get("token_embd.weight", 0))
    return [per_layer.get(i, 0) for i in range(max(per_layer) + 1)], head


def plan_pipeline(
    path: os.PathLike[str] | str,
    splits: Sequence[tuple[int, int]],
    node_bytes: Sequence[int],
    options: Mapping[str, Any],
    *,
    floor_ctx_per_session: int = 128,
) -> PipelinePlan:
    """Load each stage (its layers only), measure its costs and size its lanes on its node."""
    if len(splits) != len(node_bytes):
        raise PlanError(f"{len(splits)} stages but {len(node_bytes)} node budgets")
    stages = []
    for index, (layers, budget) in enumerate(zip(splits, node_bytes)):
        with Model(path, repack=False, layers=tuple(layers)) as model:
            weights = model.loaded_bytes
            if budget <= weights:
                raise PlanError(f"stage {index} {tuple(layers)}: its weights ({weights} bytes) fill its node ({budget} bytes)")
            lanes = plan_for(model, options, n_ctx=None, memory_bytes=budget - weights,
                             floor_ctx_per_session=floor_ctx_per_session)
        stages.append(StagePlan(tuple(layers), budget, weights, lanes))
    return PipelinePlan(tuple(stages))
