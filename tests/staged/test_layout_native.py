"""llama.cpp builds a qwen3next's attention layers where staged._layout says, from the file's own
full_attention_interval: the ledger of each stage counts exactly the attention and recurrent
layers the reader predicts, and only the cuts the rule allows leave both kinds in every stage."""

from __future__ import annotations

import attrs
import pytest

from skippy.kv import ComponentKind
from skippy.models.synth import TINY, write_sized
from skippy.native import Context, ContextOptions, Model
from skippy.staged._layout import file_boundary_rule, recurrent_layers

pytestmark = pytest.mark.native
OPTIONS = ContextOptions(n_ctx=256, n_batch=32, n_ubatch=32, n_seq_max=1, threads=1)


def _per_unit(path, layers=None) -> tuple[float, float]:
    """(attention bytes per cell, recurrent bytes per sequence) of the memory llama.cpp builds."""
    with Model(path, repack=False, layers=layers) as model, Context(model, OPTIONS) as ctx:
        ledger = ctx.ledger()
    attn, rec = ledger.get(ComponentKind.ATTN), ledger.get(ComponentKind.RECURRENT)
    return (attn.bytes / attn.size if attn.size else 0.0), (rec.bytes / rec.size if rec.size else 0.0)


def test_llama_cpp_attends_at_the_layers_the_file_names(native_build, tmp_path):
    path = write_sized("qwen3next", tmp_path / "q3.gguf", 6, attrs.evolve(TINY, extra={"full_attention_interval": 3}))
    flags = recurrent_layers(path)
    assert flags == (True, True, False, True, True, False)  # interval 3: neither the synth's 2 nor llama.cpp's 4
    attn, rec = _per_unit(path)
    per_attn, per_rec = attn / flags.count(False), rec / flags.count(True)
    rule = file_boundary_rule(path, "qwen3next")
    for begin, end in ((0, 2), (0, 3), (3, 6)):
        got = _per_unit(path, (begin, end))
        part = flags[begin:end]
        assert got == (per_attn * part.count(False), per_rec * part.count(True)), (begin, end)
        allowed = end == 6 or rule(end)
        assert (got[0] > 0 and got[1] > 0) == allowed, (begin, end)  # the forbidden [0, 2) has no attention layer
    assert not rule(2) and rule(3)


def test_skippy_pipeline_refuses_a_cut_the_file_forbids(native_build, tmp_path):
    """Interval 3: layer 1 is recurrent, so `--layers 0:2,2:6` is refused before any stage starts
    (with the old fixed interval of 2 it was accepted)."""
    import subprocess
    import sys

    path = write_sized("qwen3next", tmp_path / "q3.gguf", 6, attrs.evolve(TINY, extra={"full_attention_interval": 3}))
    run = subprocess.run([sys.executable, "-m", "skippy", "pipeline", "--model", str(path), "--layers", "0:2,2:6"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["skippy: error: stage 0 ends at layer 2, where this family may not be cut"]
