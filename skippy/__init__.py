"""Skippy: many concurrent LLM sessions through one shared llama.cpp context."""

from loguru import logger as _logger

from .errors import (
    EmptyPromptError,
    EngineClosedError,
    InvalidInputError,
    InvalidMaxTokensError,
    OverloadedError,
    PromptTooLongError,
    SkippyError,
    StepFailedError,
    StreamStateError,
)

# A library stays quiet unless the application asks (loguru's advice for libraries):
# `skippy` commands and users call logger.enable("skippy").
_logger.disable("skippy")

# The engine pulls in trio, numpy and the actors; `skippy build` and the error types must
# not pay for that, so the rest of the public surface is resolved on first use.
_LAZY = {
    "Engine": ".engine",
    "EngineConfig": ".engine",
    "GenerationStream": ".engine",
    "open_engine": ".engine",
    "SamplingParams": ".sampling",
    "FinishReason": ".scheduling.requests",
    "TokenEvent": ".scheduling.requests",
    "Usage": ".scheduling.requests",
    "EngineStats": ".telemetry",
    "StepReport": ".telemetry",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'skippy' has no attribute {name!r}")


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
    "StreamStateError",
    "StepReport",
    "TokenEvent",
    "Usage",
    "__version__",
    "open_engine",
]
