"""Each stage's lanes on its own node, and the pipeline ceiling as the weakest stage's: measured
on SmolLM2's pinned three-stage split with the real library (patch 0006)."""

from __future__ import annotations

import pytest

from skippy.native import Model
from skippy.scheduling.lanes import PlanError
from skippy.staged import PINNED_SPLITS, plan_pipeline

pytestmark = [pytest.mark.staged, pytest.mark.native]

OPTIONS = {"n_batch": 64, "n_ubatch": 64, "threads": 2, "batch_invariant": True}
MIB = 1 << 20
SPLIT = PINNED_SPLITS["smollm2"][3]


@pytest.fixture(scope="module")
def full_weights(smollm2_path) -> int:
    with Model(smollm2_path, repack=False) as model:
        return model.loaded_bytes


def test_a_stage_carries_more_sessions_than_the_whole_model_on_the_same_node(smollm2_path, full_weights):
    node = full_weights + 48 * MIB
    whole = plan_pipeline(smollm2_path, [(0, 30)], [node], OPTIONS)
    staged = plan_pipeline(smollm2_path, SPLIT, [node] * 3, OPTIONS)
    assert sum(s.weight_bytes for s in staged.stages) >= full_weights  # every layer is somewhere
    assert all(s.weight_bytes < full_weights for s in staged.stages)
    # a third of the layers: about a third of the bytes per cell, and more room left after weights
    assert staged.ceiling >= 2 * whole.ceiling, (staged.ceiling, whole.ceiling)


def test_the_weakest_node_bounds_the_pipeline(smollm2_path, full_weights):
    strong, weak = full_weights + 64 * MIB, full_weights // 3 + 40 * MIB
    plan = plan_pipeline(smollm2_path, SPLIT, [strong, weak, strong], OPTIONS)
    ceilings = [s.lanes.ceiling for s in plan.stages]
    assert plan.bounding_stage == 1
    assert plan.ceiling == ceilings[1] < min(ceilings[0], ceilings[2])


def test_a_node_too_small_for_its_stages_weights_is_refused(smollm2_path):
    with pytest.raises(PlanError, match="stage 1"):
        plan_pipeline(smollm2_path, SPLIT, [1 << 34, 1 * MIB, 1 << 34], OPTIONS)
