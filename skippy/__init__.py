"""Skippy: many concurrent LLM sessions through one shared llama.cpp context."""

from .engine import Engine, EngineConfig, GenerationStream, open_engine
from .errors import (
    EmptyPromptError,
    EngineClosedError,
    InvalidInputError,
    InvalidMaxTokensError,
    OverloadedError,
    PromptTooLongError,
    SkippyError,
    StepFailedError,
)
from .sampling import SamplingParams
from .scheduling.requests import FinishReason, TokenEvent, Usage
from .telemetry import EngineStats, StepReport

__version__ = "0.1.0"

__all__ = [
    "EmptyPromptError",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "GenerationStream",
    "InvalidInputError",
    "InvalidMaxTokensError",
    "OverloadedError",
    "PromptTooLongError",
    "SamplingParams",
    "SkippyError",
    "StepFailedError",
    "StepReport",
    "TokenEvent",
    "Usage",
    "__version__",
    "open_engine",
]
