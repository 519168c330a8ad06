"""Fixtures of the server suite (helpers live in _live.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """The default model, loaded once per module without repacked weights (batch-invariant engines)."""
    from skippy.native import Model

    with Model(smollm2_path, repack=False) as model:
        yield model
