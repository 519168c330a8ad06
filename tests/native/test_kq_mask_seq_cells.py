"""Patch 0011: the KQ mask row of a sequence's first token in a ubatch is built from that
sequence's own cells instead of a scan of the whole pool. Its exactness claim (the same mask
bytes, so the same logits) is checked against the scan, which SKIPPY_KQ_MASK_SCAN_ALL=1 restores
in the same build, on every family's logits: 8 interleaved sequences with staggered arrivals,
chunked prefill and decodes mixed in (dense, sliding-window, MLA, hybrid recurrent models).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _child import digest_with

pytestmark = pytest.mark.native

CHILD = Path(__file__).parent / "_fa_logits.py"


@pytest.mark.parametrize("name", ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next", "smollm2", "gemma3"])
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "default"])
def test_logits_are_those_of_the_full_scan(name, invariant, request, synth_model_path):
    path = request.getfixturevalue(f"{name}_path") if name in ("smollm2", "gemma3") else synth_model_path(name)
    args = [str(path), "1" if invariant else "0", "512"]
    assert digest_with(CHILD, args, "SKIPPY_KQ_MASK_SCAN_ALL", False) == digest_with(CHILD, args, "SKIPPY_KQ_MASK_SCAN_ALL", True)
