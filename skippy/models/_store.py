"""Cached synthetic models and the one resolver every entry point uses to turn a name into a file."""

from __future__ import annotations

from pathlib import Path

from .._cache import cache_root
from ..errors import ModelLoadError
from . import synth
from ._fetch import DEFAULT_MODEL, REAL_MODELS, real_model


def synthetic_model(family: str, seed: int = 0, deep: bool = False, size: str = "tiny") -> Path:
    """The synthetic model of a family, written once per (family, seed, depth, size, quantization,
    generator version). `deep`: enough layers to split into three stages. `size="base"`: the
    realistic shape of synth.BASE, quantized as users run it (synth.base_quant(); a minute to write
    the first time)."""
    if family not in synth.FAMILIES + synth.REFUSED_FAMILIES:
        raise ModelLoadError(f"unknown family {family!r}; known: {', '.join(synth.FAMILIES)}")
    if size not in synth.SIZES:
        raise ModelLoadError(f"unknown size {size!r}; known: {', '.join(synth.SIZES)}")
    if size == "base" and family not in synth.BASE:
        raise ModelLoadError(f"no base size for {family!r}; base families: {', '.join(synth.BASE)}")
    depth = "-deep" if deep else ""
    shape = f"-base-{synth.base_quant().lower()}" if size == "base" else ""
    name = f"{family}{depth}{shape}-s{seed}-v{synth.GENERATOR_VERSION}.gguf"
    path = cache_root() / "models" / "synth" / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synth.write_synthetic(family, path, seed=seed, deep=deep, size=size)
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
