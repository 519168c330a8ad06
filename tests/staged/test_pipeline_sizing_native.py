"""Stage 0 sizes its context like the engine and the later stages (skippy._plan.size_context):
from its own memory budget (`--memory`), then capped by what the stages below hold and divided
among its groups. It used to ignore the budget and take min(4096, the cells below)."""

from __future__ import annotations

import pytest
import trio

from skippy._plan import context_base, plan_for
from skippy.native import Model
from skippy.staged import PINNED_SPLITS
from skippy.staged._pipeline import open_pipeline
from skippy.staged._stage import StageRuntime, serve_stage

pytestmark = [pytest.mark.staged, pytest.mark.native]

N_BATCH = 64
BELOW_CELLS = 4096  # the later stage's pool: ceiling 4096 / 128 = 32 sessions
SMALL = 3 * 2**20  # a stage-0 budget that holds far fewer cells and lanes than the stage below
LARGE = 64 * 2**20  # one that holds more: the stage below caps it


def _groups_of(engine) -> list:
    return list(getattr(engine, "engines", [engine]))


@pytest.mark.parametrize(("name", "groups"), [("llama", 1), ("llama", 2), ("falcon-h1", 1)])
async def test_stage_0_sizes_itself_from_its_memory_budget(name, groups, synth_model_path):
    path = synth_model_path(name, deep=True)
    splits = PINNED_SPLITS[name][2]
    with Model(path, repack=False, layers=splits[0]) as local:
        want = plan_for(local, context_base(N_BATCH, 1, True), n_ctx=None, memory_bytes=SMALL // groups)
    with trio.fail_after(180):
        below = StageRuntime(path, splits[1], n_ctx=BELOW_CELLS, n_batch=N_BATCH, threads=1)
        try:
            assert below.lanes == 32
            # the budget's own plan is well inside what the stage below holds, so it decides
            assert want.n_ctx * groups < BELOW_CELLS and want.ceiling * groups < below.lanes
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_stage, below, "127.0.0.1", 0, None)
                async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), memory_bytes=SMALL,
                                         n_batch=N_BATCH, threads=1, groups=groups) as engine:
                    assert (engine.pipeline.lanes_below, engine.pipeline.cells_below) == (32, BELOW_CELLS)
                    for group in _groups_of(engine):
                        assert (group.runtime.n_ctx, group.lanes.ceiling) == (want.n_ctx, want.ceiling)
                        assert group.lanes.memory_bytes == SMALL // groups
                    # what llama.cpp really allocated at stage 0, over every group, is within the budget
                    allocated = sum(c.bytes for g in _groups_of(engine) for c in g.runtime.ledger().components)
                    assert 0 < allocated <= SMALL
                    assert engine.lanes.ceiling == want.ceiling * groups
                    streams = [engine.generate([300 + i, 301, 302], max_tokens=3, ignore_eos=True) for i in range(3)]
                    for stream in streams:
                        events = [event async for event in stream]
                        assert events[-1].finish_reason == "length" and events[-1].usage.completion_tokens == 3
                # a budget that holds more than the stage below: its pool and lanes are capped there
                async with open_pipeline(path, splits[0][1], ("127.0.0.1", port), memory_bytes=LARGE,
                                         n_batch=N_BATCH, threads=1, groups=groups) as engine:
                    for group in _groups_of(engine):
                        assert group.runtime.n_ctx == BELOW_CELLS // groups
                        assert group.lanes.ceiling == 32 // groups
                nursery.cancel_scope.cancel()
        finally:
            below.close()
