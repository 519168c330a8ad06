"""Skippy: many concurrent LLM sessions through one shared llama.cpp context."""

from .errors import SkippyError

__version__ = "0.1.0"

__all__ = ["SkippyError", "__version__"]
