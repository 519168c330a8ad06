"""Several engines over one pipeline: cross-step pipelining (vLLM's "virtual engines").

Within a step, micro-batches keep the stages busy together; at the step boundary they drain,
since a sequence's next step needs the token its last one is still computing below. Groups
fill that bubble: the running sessions are split across G independent engines (each its own
stage-0 context, lanes and actors, over the same model and the same link), so while group A's
step is in the stages below, group B's step is computed at stage 0. Each group is exactly an
engine, so parity, preemption and memory accounting are the engine's own.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

from ..telemetry import EngineStats


class PipelineEngine:
    """The Engine surface (generate, stats, runtime, lanes) over G group engines."""

    def __init__(self, engines: Sequence[Any], pipeline: Any) -> None:
        self.engines = list(engines)
        self.pipeline = pipeline
        self.runtime = self.engines[0].runtime  # tokenizer, model, n_ctx: the same in every group
        self.config = self.engines[0].config
        self.lanes = attrs.evolve(self.engines[0].lanes, ceiling=sum(e.lanes.ceiling for e in self.engines))

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Queue on the group with the fewest live requests (ties: the first)."""
        engine = min(self.engines, key=lambda e: len(e._live))
        return engine.generate(*args, **kwargs)

    def stats(self) -> EngineStats:
        return merge_stats([e.stats() for e in self.engines])


def merge_stats(parts: Sequence[EngineStats]) -> EngineStats:
    """Totals over the groups: counts, times and memory add up (each group has its own pool)."""
    merged: dict[str, Any] = {}
    for field in attrs.fields(EngineStats):
        values = [getattr(p, field.name) for p in parts]
        if field.name == "kv_bytes_per_cell":  # a property of the model, not a count
            merged[field.name] = values[0]
        elif isinstance(values[0], Mapping):
            total: dict = {}
            for value in values:
                for key, v in value.items():
                    total[key] = total.get(key, 0) + v
            merged[field.name] = total
        else:
            merged[field.name] = sum(values)
    return EngineStats(**merged)
