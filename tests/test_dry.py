"""DRY (skippy._dry): the port of llama.cpp's Z-algorithm against a plain O(n^2) reading of the same
definition, llama.cpp's own worked example, and the breaker table on a toy vocabulary. The port
against llama.cpp's real sampler: tests/native/test_samplers_vs_llama.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from skippy import _dry
from skippy.errors import InvalidInputError
from skippy.sampling import Sampler, SamplingParams


def reference(window: list[int], table: dict, multiplier: float, base: float, allowed: int) -> dict[int, float]:
    """The definition, slowly: the nearest restart sequence (newest first) caps a repeat's length;
    each earlier position j whose tokens up to j equal the window's last m tokens (m as long as
    possible, capped) makes the token after j worth a penalty for length m; a token keeps its longest."""
    n = len(window)
    if n <= allowed:
        return {}
    back = window[::-1]
    limit = n
    for i in range(n):
        tails = [t for t in table.get(back[i], ()) if len(t) <= i and list(t) == [back[i - o - 1] for o in range(len(t))]]
        if tails:
            limit = i - max(len(t) for t in tails)
            break
    if limit < allowed:
        return {}
    longest: dict[int, int] = {}
    for j in range(n - 1):
        m = 0
        while m <= j and window[j - m] == window[n - 1 - m]:
            m += 1
        m = min(m, limit)
        if m >= allowed:
            longest[window[j + 1]] = max(longest.get(window[j + 1], -1), m)
    cap = int(np.float32(88.7228391) / np.float32(np.log(np.float32(base)))) if base > 1.000001 else 0
    return {t: float(np.float32(multiplier * base ** (min(m - allowed, cap) if cap else m - allowed)))
            for t, m in longest.items() if () not in table.get(t, ())}


def test_llama_cpps_worked_example():
    """llama.cpp's comment: 'a b c c b c y a b c' repeats the suffix 'a b c' (3 tokens, so c next
    would make 4), 'c' (b next) and 'b c' (y next)."""
    a, b, c, y = 1, 2, 3, 4
    got = _dry.dry_penalties([a, b, c, c, b, c, y, a, b, c], {}, 1.0, 2.0, 1)
    assert got == {c: 4.0, b: 1.0, y: 2.0}  # 2^(3-1), 2^(1-1), 2^(2-1)
    assert _dry.dry_penalties([a, b, c, c, b, c, y, a, b, c], {}, 1.0, 2.0, 3) == {c: 1.0}


def test_a_breaker_stops_the_repeat_and_is_never_penalized():
    nl = 9
    window = [1, 2, 3, nl, 1, 2, 3, nl, 1, 2]
    # no breaker: the suffix '1 2 3 9 1 2' (6 tokens) occurred before, followed by 3: 3 next costs 2^(6-2)
    assert _dry.dry_penalties(window, {}, 1.0, 2.0, 2) == {3: 16.0}
    # the breaker 9 two tokens back caps a repeat at 2 tokens (2^0)
    assert _dry.dry_penalties(window, {nl: ((),)}, 1.0, 2.0, 2) == {3: 1.0}
    # a two-token breaker (9 then 1): it ends 2 back, so repeats are capped at 1 token < allowed
    assert _dry.dry_penalties(window, {nl: ((1,),)}, 1.0, 2.0, 2) == {}


@settings(max_examples=300, deadline=None)
@given(window=st.lists(st.integers(0, 4), max_size=48), allowed=st.integers(0, 4),
       base=st.sampled_from([1.0, 1.5, 1.75, 3.0]), multiplier=st.sampled_from([0.5, 0.8, 2.0]),
       breakers=st.dictionaries(st.integers(0, 4), st.lists(st.lists(st.integers(0, 4), max_size=2).map(tuple),
                                                           min_size=1, max_size=2).map(tuple), max_size=2))
def test_the_z_algorithm_port_is_the_definition(window, allowed, base, multiplier, breakers):
    assert _dry.dry_penalties(window, breakers, multiplier, base, allowed) == pytest.approx(
        reference(window, breakers, multiplier, base, allowed))


def test_the_exponent_is_clamped_before_float_overflow():
    window = [1] * 300
    got = _dry.dry_penalties(window, {}, 1.0, 1.75, 0)
    cap = int(np.float32(88.7228391) / np.float32(np.log(np.float32(1.75))))  # 158
    assert got[1] == pytest.approx(float(np.float32(1.75 ** cap))) and np.isfinite(got[1])


def test_the_breaker_table_on_a_toy_vocabulary():
    pieces = [b"a", b"\n", b"x:y", b"ab", b"xa", b"b", b"q"]

    def tokenize(text: bytes) -> list[int]:
        return [pieces.index(bytes([ch])) for ch in text]

    table = _dry.breaker_table(pieces, tokenize, ["\n", ":", "ab"])
    assert table[1] == ((),) and table[2] == ((),) and table[3] == ((),)  # they hold a breaker
    # 'xa' and 'a' end with the start of 'ab': heads, with 'b' (token 5) to follow
    assert table[4] == ((5,),) and table[0] == ((5,),)
    assert 6 not in table and 5 not in table
    assert _dry.pairs_table(_dry.table_pairs(table)) == table


def test_the_sampler_applies_dry_after_the_penalties_on_prompt_and_output():
    p = SamplingParams(temperature=0, dry_multiplier=0.8, dry_allowed_length=2, dry_breakers=[])
    s = Sampler(p, [5, 6, 7, 5, 6])
    logits = np.zeros(10, np.float32)
    logits[7] = 0.5  # the best, but '5 6' then 7 would repeat 3 tokens: 0.5 - 0.8 < 0
    assert s(logits) != 7 and not p.greedy
    assert SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=0, dry_breakers=[]).greedy  # last_n 0: off
    with pytest.raises(InvalidInputError, match="vocabulary"):
        Sampler(SamplingParams(dry_multiplier=0.8))  # breaker strings, never resolved
    window = SamplingParams(temperature=0, dry_multiplier=0.8, dry_penalty_last_n=3, dry_breakers=[])
    assert Sampler(window, [5, 6, 7, 5, 6]).shape(logits)[7] == 0.5  # 7 is out of the last 3 tokens


def test_under_mirostat_only_logit_bias_shapes_as_in_llama_cpps_chain():
    """llama.cpp's chain under mirostat is logit_bias, temperature, mirostat: penalties and DRY are
    not in it, so they change nothing here either."""
    p = SamplingParams(temperature=1.0, mirostat=1, repeat_penalty=1.5, presence_penalty=1.0, dry_multiplier=0.8,
                       dry_breakers=[], logit_bias={3: -2.0})
    logits = np.linspace(0, 1, 10).astype(np.float32)
    shaped = Sampler(p, [3, 4, 5, 3, 4]).shape(logits)
    want = logits.astype(np.float64)
    want[3] -= 2.0
    assert np.array_equal(shaped, want) and not p.penalizes
    assert not SamplingParams(temperature=1.0, mirostat=2, repeat_penalty=1.5).shapes_logits
