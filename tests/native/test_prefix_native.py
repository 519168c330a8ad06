"""Prefix reuse on the real library, per KV class: what llama.cpp's memory really shares.

Token parity with hits is in tests/parity; here: cells (from the KV ledger) and the
family rules of ContextRuntime.share.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio

import skippy
from skippy._generate import generate_tokens
from skippy.kv import ComponentKind
from skippy.native import Context, ContextOptions, Model
from skippy.runtime import ContextRuntime

pytestmark = pytest.mark.native

FAMILIES = ["llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next"]
ATTN = ComponentKind.ATTN


@pytest.mark.parametrize("family", FAMILIES)
async def test_sixteen_sessions_over_one_system_prompt_hold_it_once(family, synth_model_path):
    """16 sessions over a shared 512-token prefix use about one prefix plus 16 suffixes of cells."""
    rng = np.random.default_rng(3)
    with Model(synth_model_path(family), repack=False) as m:
        system = rng.integers(260, m.n_vocab, size=512).astype(np.int32)
        prompts = [np.concatenate([system, rng.integers(260, m.n_vocab, size=8).astype(np.int32)]) for _ in range(16)]
        with trio.fail_after(120):
            # all 16 at once (admission by memory alone): what is measured is the cells, not the latency targets
            async with skippy.open_engine(m, n_ctx=4096, n_batch=256, n_seq_max=16, threads=1,
                                          slo_scheduling=False) as engine:
                async def one(p):
                    events = [e async for e in engine.generate(p, max_tokens=8, ignore_eos=True)]
                    assert events[-1].finish_reason == "length"

                async with trio.open_nursery() as nursery:
                    for p in prompts:
                        nursery.start_soon(one, p)
                stats = engine.stats()
    assert stats.prefix_hits >= 15 * 512
    per_session = 8 + 8  # suffix + generated
    assert stats.kv_used_peak[ATTN] < 512 + 16 * per_session * 1.5, stats.kv_used_peak
    assert stats.max_running == 16


def _reference(m: Model, p: np.ndarray, n: int = 10) -> list[int]:
    """Greedy tokens of `p` alone in a fresh batch-invariant context."""
    with Context(m, ContextOptions(n_ctx=1024, n_batch=64, n_ubatch=64, threads=1, batch_invariant=True)) as ctx:
        return list(generate_tokens(ctx, p, n))


def _runtime(m: Model, **opts) -> ContextRuntime:
    base = dict(n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, threads=1, batch_invariant=True)
    return ContextRuntime(m, ContextOptions(**{**base, **opts}))


def _feed(rt: ContextRuntime, seq: int, tokens: np.ndarray, start: int = 0) -> np.ndarray:
    """Prefill in 64-token chunks; the logits of the last token."""
    for i in range(start, start + tokens.size, 64):
        part = tokens[i - start : i - start + 64]
        out = np.zeros(part.size, dtype=np.int8)
        out[-1] = 1
        logits = rt.decode(part, np.arange(i, i + part.size, dtype=np.int32), np.full(part.size, seq, dtype=np.int32), out)
    return np.array(logits[-1])


def _continue(rt: ContextRuntime, seq: int, first_logits: np.ndarray, pos: int, n: int) -> list[int]:
    tokens, logits = [], first_logits
    for k in range(n):
        t = int(np.argmax(logits))
        tokens.append(t)
        logits = np.array(rt.decode(np.array([t], np.int32), np.array([pos + k], np.int32), np.array([seq], np.int32),
                                    np.ones(1, np.int8))[0])
    return tokens


@pytest.mark.parametrize("family", ["llama", "deepseek2"])
def test_attention_cells_share_at_any_length(family, synth_model_path):
    rng = np.random.default_rng(1)
    with Model(synth_model_path(family), repack=False) as m:
        p = rng.integers(260, m.n_vocab, size=100).astype(np.int32)
        want = _reference(m, p)
        rt = _runtime(m)
        try:
            _feed(rt, 0, np.concatenate([p[:70], rng.integers(260, m.n_vocab, size=50).astype(np.int32)]))
            used = rt.ledger().get(ATTN).used
            assert rt.share(0, 1, 70) == 70 and rt.ledger().get(ATTN).used == used  # shared, not copied
            assert rt.share(0, 2, 121) == 0  # more than the source holds
            got = _continue(rt, 1, _feed(rt, 1, p[70:], start=70), 100, 10)
        finally:
            rt.close()
    assert got[: len(want)] == want  # the reference stops at end-of-generation


@pytest.mark.parametrize("family", ["falcon-h1", "qwen3next"])
def test_a_recurrent_state_shares_only_whole(family, synth_model_path):
    """llama.cpp copies the whole state whatever p1 says: only the source's own length is exact."""
    rng = np.random.default_rng(2)
    with Model(synth_model_path(family), repack=False) as m:
        p = rng.integers(260, m.n_vocab, size=90).astype(np.int32)
        want = _reference(m, p)
        rt = _runtime(m)
        try:
            _feed(rt, 0, p[:60])
            assert rt.share(0, 1, 40) == 0 and rt.ctx.seq_pos_max(1) == -1  # a state at 60 is not one at 40
            slots = rt.ledger().get(ComponentKind.RECURRENT).used
            assert rt.share(0, 1, 60) == 60
            assert rt.ledger().get(ComponentKind.RECURRENT).used == slots  # one state, two sequences
            got = _continue(rt, 1, _feed(rt, 1, p[60:], start=60), 90, 10)
            # the copy-on-write gave seq 1 a state of its own; seq 0's snapshot still continues exactly
            assert rt.ledger().get(ComponentKind.RECURRENT).used == slots + 1
            again = _continue(rt, 0, _feed(rt, 0, p[60:], start=60), 90, 10)
        finally:
            rt.close()
    assert got[: len(want)] == want and again[: len(want)] == want  # the reference stops at end-of-generation


def test_a_sliding_window_that_moved_on_is_not_shared(synth_model_path):
    """ISWA: the window cache recycles a sequence's out-of-window cells once it needs room; a
    prefix whose window cells are gone is refused (recomputed), one whose window is intact shares."""
    rng = np.random.default_rng(4)
    with Model(synth_model_path("gemma2"), repack=False) as m:
        n_swa = m.n_swa
        p = rng.integers(260, m.n_vocab, size=40).astype(np.int32)
        want = _reference(m, p)
        rt = _runtime(m, n_seq_max=2)
        try:
            tail = rng.integers(260, m.n_vocab, size=600).astype(np.int32)
            _feed(rt, 0, np.concatenate([p[:30], tail]))  # long enough to fill and recycle the window cache
            assert rt.ctx.seq_pos_min(0) > 30 - n_swa + 1
            assert rt.share(0, 1, 30) == 0 and rt.ctx.seq_pos_max(1) == -1
            rt.seq_rm(0)
            _feed(rt, 0, p[:30])  # fresh: the window behind position 30 is intact
            assert rt.share(0, 1, 30) == 30
            got = _continue(rt, 1, _feed(rt, 1, p[30:], start=30), 40, 10)
        finally:
            rt.close()
    assert got[: len(want)] == want  # the reference stops at end-of-generation
