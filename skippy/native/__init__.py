"""The only code that touches llama.cpp: build, cffi bindings and safe wrappers."""

from ._build import BuildFlags, NativeBuild, ensure_built, ensure_stock_tools, locate
from .batch import Batch
from .context import Context, ContextOptions, FaultKind
from .model import Model
from .probe import probe_model
from .tokenizer import Tokenizer

__all__ = [
    "Batch",
    "BuildFlags",
    "Context",
    "ContextOptions",
    "FaultKind",
    "Model",
    "NativeBuild",
    "Tokenizer",
    "ensure_built",
    "ensure_stock_tools",
    "locate",
    "probe_model",
]
