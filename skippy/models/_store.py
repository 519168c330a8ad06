"""Cached synthetic models and the one resolver every entry point uses to turn a name into a file."""

from __future__ import annotations

from pathlib import Path

from .._cache import cache_root
from ..errors import ModelLoadError
from . import synth
from ._fetch import DEFAULT_MODEL, REAL_MODELS, real_model


def synthetic_model(family: str, seed: int = 0, deep: bool = False) -> Path:
    """The tiny model of a family, written once per (family, seed, depth, generator version).
    `deep`: enough layers to split into three stages."""
    if family not in synth.FAMILIES + synth.REFUSED_FAMILIES:
        raise ModelLoadError(f"unknown family {family!r}; known: {', '.join(synth.FAMILIES)}")
    depth = "-deep" if deep else ""
    path = cache_root() / "models" / "synth" / f"{family}{depth}-s{seed}-v{synth.GENERATOR_VERSION}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synth.write_synthetic(family, path, seed=seed, deep=deep)
    return path


def resolve_model(model: str | Path | None = None, family: str | None = None, seed: int = 0) -> Path:
    """A path as given; a real model's name; a synthetic family; or the embedded default."""
    if model is not None and family is not None:
        raise ModelLoadError("give either a model or a family, not both")
    if family is not None:
        return synthetic_model(family, seed)
    if model is None:
        return real_model(DEFAULT_MODEL)
    if isinstance(model, str) and model in REAL_MODELS:
        return real_model(model)
    return Path(model)
