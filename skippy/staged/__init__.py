"""Staged serving: a model split into layer-range stages, one engine process per stage.

Stage 0 owns the request API, tokenization and admission; activations flow down the
pipeline as frames over TCP and the last stage samples and returns tokens to stage 0.
This package holds the pure foundation: the frame codec, the frame stream, and splits.
"""

from ._frames import (
    DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE, VERSION, Activations, Auth, Error, FrameError, Hello, Kind, Message, Open, Release,
    StepEnd, Token, decode, decode_header, decode_payload, encode,
)
from ._splits import (
    PINNED_N_LAYER, PINNED_SPLITS, SplitError, balanced_split, boundary_rule, even_split, pipeline_ceiling, plan_split, validate_split,
)
from ._stage_plan import PipelinePlan, StagePlan, layer_costs, plan_pipeline
from ._transport import FrameStream, StageDisconnected, connect

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES", "HEADER_SIZE", "PINNED_N_LAYER", "PINNED_SPLITS", "VERSION", "Activations", "Auth",
    "Error",
    "FrameError", "FrameStream", "Hello", "Kind", "Message", "Open", "PipelinePlan", "Release", "SplitError",
    "StageDisconnected", "StagePlan", "StepEnd", "balanced_split", "layer_costs",
    "Token", "boundary_rule", "connect", "decode", "decode_header", "decode_payload", "encode", "even_split",
    "pipeline_ceiling", "plan_pipeline", "plan_split", "validate_split",
]
