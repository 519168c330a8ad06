"""Patch 0010: flash attention's visiting lists are built once per graph compute and shared by the
layers. Its exactness claim, at kernel level: every layer after the first gives the bytes it gives
alone, and a graph computed again after its mask changed in place (the same tensors and buffers,
as llama.cpp reuses a graph from one ubatch to the next) visits the new mask's cells.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _harness import build_harness, public_api_flags, run_harness

pytestmark = pytest.mark.native

HARNESS = Path(__file__).parent / "fa_visit_cache.c"


@pytest.fixture(scope="module")
def lines(native_build, tmp_path_factory) -> list[list[str]]:
    exe = build_harness(native_build, HARNESS, tmp_path_factory.mktemp("harness"), public_api_flags(native_build))
    out = run_harness(exe)
    assert len(out) == 3 * 2 * 2 * 2  # query counts x modes x computes x layers
    return out


@pytest.mark.parametrize("mode", ["default", "invariant"])
def test_a_later_layer_reads_the_same_lists_the_first_built(lines, mode):
    for case, layer, verdict in lines:
        if case.endswith("compute0") and f"_{mode}_" in case:
            assert verdict == "same", (case, layer)


@pytest.mark.parametrize("mode", ["default", "invariant"])
def test_a_mask_changed_in_place_is_visited_anew_on_the_next_compute(lines, mode):
    for case, layer, verdict in lines:
        if case.endswith("compute1") and f"_{mode}_" in case:
            assert verdict == "same", (case, layer)
