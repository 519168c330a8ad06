"""vLLM's min_tokens, stop_token_ids and include_stop_str_in_output: the sampler's mask and the stop
matcher (pure), and the scheduler's use of them over a FakeRuntime (its vocabulary: token t spells
chr(ord('a') + t % 26), token 0 ends). On the real library: tests/native/test_end_fields_native.py."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from skippy.errors import InvalidInputError
from skippy.sampling import Sampler, SamplingParams
from skippy.scheduling.text import StopMatcher
from skippy.testing import FakeRuntime, open_fake_engine


def test_held_ids_cannot_be_picked_until_enough_tokens_are():
    s = Sampler()
    s.hold_ends([0, 3], until=2)
    row = np.array([5.0, 1.0, 2.0, 9.0], dtype=np.float32)
    assert not s.greedy  # the vectorised argmax would not see the mask
    before = s.state()
    assert s(row) == 2 and s(row) == 2  # 3 and 0 are out; the rest keep their order
    assert s.greedy and s(row) == 3  # from the third pick on, nothing is held
    assert row.tolist() == [5.0, 1.0, 2.0, 9.0]  # the caller's row is not written
    s.restore(before)  # a failed step: the count goes back with the RNG
    assert not s.greedy and s(row) == 2


def test_held_ids_and_penalties_together_and_a_seeded_draw_repeats():
    p = SamplingParams(temperature=0.8, seed=5, presence_penalty=0.5)
    row = np.linspace(0, 3, 8).astype(np.float32)
    picks = []
    for _ in range(2):
        s = Sampler(p, prompt=[1, 2])
        s.hold_ends([7, 6], until=50)
        picks.append([s(row) for _ in range(40)])
    assert picks[0] == picks[1] and not {6, 7} & set(picks[0])


def test_include_keeps_the_stop_string_and_check_false_holds_a_straddling_one():
    m = StopMatcher(("END", "EN"), include=True)
    assert m.push("abcENDxyz") == ("abcEND", True)  # at one place the longer stop string
    m = StopMatcher(("END",))
    assert m.push("xEND", check=False) == ("xEND", False)  # not looked for before min_tokens
    assert m.push("aaEN", check=False) == ("aa", False)  # but a tail that may begin one is held
    assert m.push("Dzz") == ("", True)  # completed after: found


def _solo_ending_early(rt: FakeRuntime, max_tokens: int) -> tuple[list[int], list[int]]:
    for i in range(200):
        p = [(i * 7 + k) % 50 + 1 for k in range(6)]
        out = rt.solo(p, max_tokens)
        if 3 <= len(out) < max_tokens - 6:
            return p, out
    raise AssertionError("no prompt ends early under this eog_every")


async def _collect(stream) -> list:
    return [e async for e in stream]


async def test_min_tokens_holds_the_end_off_and_leaves_the_tokens_before_it_alone():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4, eog_every=9)
    p, solo = _solo_ending_early(rt, 24)
    want = len(solo) + 4
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            plain = await _collect(engine.generate(p, max_tokens=24))
            held = await _collect(engine.generate(p, max_tokens=24, min_tokens=want))
    tokens = [e.token for e in held if e.token is not None]
    assert [e.token for e in plain] == solo and plain[-1].finish_reason == "stop"
    assert tokens[: len(solo) - 1] == solo[:-1]  # the same until the end it could not pick
    assert 0 not in tokens[:want] and len(tokens) >= want


async def test_a_stop_token_id_finishes_the_request_even_with_ignore_eos_and_include_keeps_its_text():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    p = [3, 1, 4, 1, 5]
    solo = rt.solo(p, 12)
    stop = solo[4]
    first = solo.index(stop)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            a = await _collect(engine.generate(p, max_tokens=12, stop_token_ids=[stop], ignore_eos=True))
            b = await _collect(engine.generate(p, max_tokens=12, stop_token_ids=[stop],
                                               include_stop_str_in_output=True))
            c = await _collect(engine.generate(p, max_tokens=12, stop_token_ids=[stop], min_tokens=first + 2))
            with pytest.raises(InvalidInputError, match="min_tokens"):
                engine.generate(p, max_tokens=4, min_tokens=5)
            with pytest.raises(InvalidInputError, match="stop_token_ids"):
                engine.generate(p, max_tokens=4, stop_token_ids=[rt.n_vocab])
    spell = lambda ts: "".join(chr(ord("a") + t % 26) for t in ts)  # noqa: E731
    assert [e.token for e in a] == solo[: first + 1] and a[-1].finish_reason == "stop"
    assert "".join(e.text for e in a) == spell(solo[:first])  # the stop id's text is not in the output
    assert "".join(e.text for e in b) == spell(solo[: first + 1])  # ... unless asked for
    assert stop not in [e.token for e in c][: first + 2]  # held out until min_tokens, like an end id
