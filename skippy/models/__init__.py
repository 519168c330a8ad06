"""Model files: the real models carried by PyPI wheels and the tiny synthetic ones per KV class."""

from ._fetch import DEFAULT_MODEL, REAL_MODELS, real_model
from ._store import resolve_model, synthetic_model

__all__ = ["DEFAULT_MODEL", "REAL_MODELS", "real_model", "resolve_model", "synthetic_model"]
