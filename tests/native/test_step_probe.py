"""The step-cost probe at open (ContextRuntime.probe_step_costs) on the real library: steps of known shape,
and over recurrent memory the ubatch split a prompt beside decode rows makes (scheduling.cost.equal_splits),
with the memory left empty for serving."""

from __future__ import annotations

import pytest

from skippy.native import ContextOptions, Model
from skippy.runtime import ContextRuntime

pytestmark = pytest.mark.native


@pytest.mark.parametrize("name, recurrent", [("llama", False), ("falcon-h1", True), ("qwen3next", True)])
def test_the_probe_times_a_split_step_exactly_where_batches_split(name, recurrent, synth_model_path):
    with Model(synth_model_path(name)) as model:
        rt = ContextRuntime(model, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=8, threads=2))
        try:
            assert rt.equal_split is recurrent
            samples = rt.probe_step_costs()
            split = [(shape, s) for shape, s in samples if shape.splits]
            assert samples and all(s > 0 for _, s in samples)
            assert bool(split) is recurrent
            for shape, _ in split:
                assert shape.splits == 1 and shape.decode_rows >= 1 and shape.prefill_tokens >= 2
            for seq in range(8):  # the probe leaves nothing behind
                assert rt.ctx.seq_pos_max(seq) == -1
        finally:
            rt.close()
