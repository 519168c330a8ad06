"""Shared fixtures: the native build, real and synthetic models, small contexts."""

from __future__ import annotations

from pathlib import Path

import pytest

FAMILIES = ("llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next")


@pytest.fixture(scope="session")
def native_build():
    """Builds on first use (cached afterwards); every native test depends on it."""
    from skippy.native import ensure_built

    return ensure_built(progress=False)


@pytest.fixture(scope="session")
def synth_model_path(native_build):
    from skippy.models import synthetic_model

    def get(family: str, seed: int = 0, deep: bool = False) -> Path:
        return synthetic_model(family, seed, deep=deep)

    return get


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from skippy.models import real_model

    return real_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from skippy.models import real_model

    return real_model("gemma3")


@pytest.fixture(scope="session")
def llama_model(synth_model_path):
    from skippy.native import Model

    with Model(synth_model_path("llama")) as model:
        yield model


@pytest.fixture
def small_ctx(llama_model):
    """A fresh 4-sequence context over the tiny llama: cheap enough for every test."""
    from skippy.native import Context, ContextOptions

    with Context(llama_model, ContextOptions(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=4, threads=1)) as ctx:
        yield ctx


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A cache root of our own for verdicts (inherited by subprocesses), sharing the real native
    build and models through symlinks."""
    from skippy._cache import cache_root

    real = cache_root()
    for name in ("native", "models"):
        (tmp_path / name).symlink_to(real / name, target_is_directory=True)
    monkeypatch.setenv("SKIPPY_CACHE", str(tmp_path))
    return tmp_path
