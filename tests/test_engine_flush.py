"""Engine.flush_prefix_cache (what a router's /flush_cache asks of a worker), over a FakeRuntime."""

from __future__ import annotations

import pytest
import trio

from skippy.errors import EngineBusyError
from skippy.kv import ComponentKind
from skippy.testing import FakeRuntime, open_fake_engine

SYSTEM = [(7 * k) % 50 + 1 for k in range(64)]


async def _drain(stream) -> list:
    return [e async for e in stream]


async def test_flush_drops_every_resident_prefix_and_frees_its_cells():
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=12, prefix=True)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=4) as engine:
            await _drain(engine.generate(SYSTEM + [1, 2, 3], max_tokens=4))
            await engine.settled()
            before = engine.stats()
            assert before.prefix_entries == 1 and before.kv_used[ComponentKind.ATTN] > 0
            assert await engine.flush_prefix_cache() == 1
            after = engine.stats()
            assert after.prefix_entries == 0 and after.prefix_resident_tokens == 0
            assert after.kv_used[ComponentKind.ATTN] == 0
            # the same prompt again: computed whole (nothing to share), then kept again
            events = await _drain(engine.generate(SYSTEM + [1, 2, 3], max_tokens=4))
            assert events[-1].usage.cached_tokens == 0
            await engine.settled()
            assert engine.stats().prefix_entries == 1
            assert await engine.flush_prefix_cache() == 1
            assert await engine.flush_prefix_cache() == 0  # nothing left: a no-op, not an error


async def test_flush_is_refused_while_a_request_runs_and_the_request_is_untouched():
    rt = FakeRuntime(n_ctx=1024, n_batch=32, n_seq_max=12, prefix=True)
    with trio.fail_after(10):
        async with open_fake_engine(rt, prefix_slots=4) as engine:
            await _drain(engine.generate(SYSTEM, max_tokens=2))
            await engine.settled()
            stream = engine.generate(SYSTEM + [9, 9], max_tokens=30, ignore_eos=True)
            first = await stream.__anext__()
            with pytest.raises(EngineBusyError):
                await engine.flush_prefix_cache()
            events = [first, *await _drain(stream)]
            assert events[-1].finish_reason == "length" and events[-1].usage.cached_tokens == 64
            await engine.settled()
            assert await engine.flush_prefix_cache() >= 1
