"""Patch 0016: a ubatch's recurrent state copies skip the cells whose state stays where it is.
Its exactness claim (the copies dropped were identities, so the same states and logits) is
checked against upstream's copy of every cell, which SKIPPY_RS_COPY_ALL=1 restores in the same
build, on every recurrent class: Mamba2 alone (the recurrent cache), Falcon-H1 (Mamba2 beside
attention) and Qwen3-Next (gated delta-net beside attention), decodes in shifting subsets so that
state ranges span cells not in the step and reorders move cells, a sequence restarted on its id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _child import digest_with

pytestmark = pytest.mark.native

CHILD = Path(__file__).parent / "_rs_copies_logits.py"


@pytest.mark.parametrize("name", ["mamba2", "falcon-h1", "qwen3next"])
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "default"])
def test_logits_are_those_of_upstreams_copies(name, invariant, synth_model_path):
    path = synth_model_path(name)
    args = [str(path), "1" if invariant else "0"]
    assert digest_with(CHILD, args, "SKIPPY_RS_COPY_ALL", False) == digest_with(CHILD, args, "SKIPPY_RS_COPY_ALL", True)
