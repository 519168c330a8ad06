"""Patch 0016: a ubatch's recurrent state copies skip the cells whose state stays where it is.
Its exactness claim (the copies dropped were identities, so the same states and logits) is
checked against upstream's copy of every cell, which SKIPPY_RS_COPY_ALL=1 restores in the same
build, on every recurrent class: Mamba2 alone (the recurrent cache), Falcon-H1 (Mamba2 beside
attention) and Qwen3-Next (gated delta-net beside attention), decodes in shifting subsets so that
state ranges span cells not in the step and reorders move cells, a sequence restarted on its id.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

CHILD = Path(__file__).parent / "_rs_copies_logits.py"


def _digest(path: Path, invariant: bool, copy_all: bool) -> str:
    env = dict(os.environ)
    env.pop("SKIPPY_RS_COPY_ALL", None)
    if copy_all:
        env["SKIPPY_RS_COPY_ALL"] = "1"
    out = subprocess.run([sys.executable, str(CHILD), str(path), "1" if invariant else "0"],
                         check=True, capture_output=True, text=True, timeout=600, env=env).stdout
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["mamba2", "falcon-h1", "qwen3next"])
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "default"])
def test_logits_are_those_of_upstreams_copies(name, invariant, synth_model_path):
    path = synth_model_path(name)
    assert _digest(path, invariant, False) == _digest(path, invariant, True)
