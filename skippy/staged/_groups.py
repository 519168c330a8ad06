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
import numpy as np

from ..telemetry import EngineStats


class PipelineEngine:
    """The Engine surface the server and callers use (generate, stats, live, the model's name,
    tokenizer and chat template, runtime, lanes, pipeline) over G group engines."""

    def __init__(self, engines: Sequence[Any], pipeline: Any) -> None:
        self.engines = list(engines)
        self.pipeline = pipeline
        self.runtime = self.engines[0].runtime  # tokenizer, model, n_ctx: the same in every group
        self.config = self.engines[0].config
        self.lanes = attrs.evolve(self.engines[0].lanes, ceiling=sum(e.lanes.ceiling for e in self.engines))

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Queue on the group with the fewest live requests (ties: the first)."""
        engine = min(self.engines, key=lambda e: e.live)
        return engine.generate(*args, **kwargs)

    def stats(self) -> EngineStats:
        return merge_stats([e.stats() for e in self.engines])

    @property
    def live(self) -> int:
        """Requests generated and not yet finished, over every group."""
        return sum(e.live for e in self.engines)

    # the model is the same in every group: the first one answers
    @property
    def model_name(self) -> str:
        return self.engines[0].model_name

    @property
    def n_ctx(self) -> int:
        """A request's limit: one group's pool (a request runs in one group)."""
        return self.engines[0].n_ctx

    @property
    def has_chat_template(self) -> bool:
        return self.engines[0].has_chat_template

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return self.engines[0].chat_tokens(messages)

    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray:
        return self.engines[0].tokenize(text, add_special)


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
