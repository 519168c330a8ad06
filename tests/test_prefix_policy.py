"""The prefix cache's pure policy: identity, hash chains, matching, recording and eviction."""

from __future__ import annotations

import numpy as np

from skippy.scheduling import Request
from skippy.scheduling.prefix import Entry, PrefixCache, block_hashes, common_prefix, identity_seed

SEED = identity_seed("digest", "llama", {"type_k": "f16"})
SYSTEM = np.arange(100, 148, dtype=np.int32)  # 48 tokens: three blocks of 16


def req(i: int, tokens, max_tokens: int = 8) -> Request:
    return Request(i, np.asarray(tokens, dtype=np.int32), max_tokens)


def with_suffix(*extra: int) -> np.ndarray:
    return np.concatenate([SYSTEM, np.asarray(extra, dtype=np.int32)])


def cache(exact: bool = False, slots: int = 4, budget: int = 1000) -> PrefixCache:
    return PrefixCache(SEED, range(10, 10 + slots), budget, block=16, exact=exact)


def test_the_hash_chain_names_whole_prefixes_under_one_identity():
    a = block_hashes(SEED, with_suffix(*range(20)), 16)
    b = block_hashes(SEED, with_suffix(*range(20, 40)), 16)
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    changed = SYSTEM.copy()
    changed[0] += 1  # one token in the first block changes every later block's name
    assert not set(block_hashes(SEED, changed, 16)) & set(a)
    other_model = identity_seed("other digest", "llama", {"type_k": "f16"})
    other_settings = identity_seed("digest", "llama", {"type_k": "q8_0"})
    assert len({SEED, other_model, other_settings}) == 3
    assert not set(block_hashes(other_settings, SYSTEM, 16)) & set(a)


def test_common_prefix():
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix(np.array([9]), np.array([1])) == 0


def test_a_recorded_prompt_is_shared_to_the_exact_common_length():
    c = cache()
    first = req(0, with_suffix(1, 2, 3))
    assert c.plan_record(first.prompt) == []
    entry = c.add(first.prompt)
    hit = c.match(req(1, with_suffix(1, 2, 9, 9)))
    assert hit.source is entry and hit.length == 50  # not rounded down to a block
    # the same prompt again: all but its last token (whose logits give the first sample)
    assert c.match(req(2, first.prompt)).length == first.prompt.size - 1
    assert c.match(req(3, np.arange(500, 540))) is None  # nothing in common
    assert c.match(req(4, SYSTEM[:15])) is None  # below one block is not worth a copy


def test_a_match_is_confirmed_token_by_token_not_trusted_to_the_hash():
    c = cache()
    impostor = Entry(10, np.arange(900, 948, dtype=np.int32), block_hashes(SEED, SYSTEM, 16), 0)
    c.entries[10] = impostor
    c._add(impostor, impostor.hashes)  # a colliding chain: same names, other tokens
    assert c.match(req(0, with_suffix(1))) is None


def test_live_requests_and_this_rounds_admissions_are_sources():
    c = cache()
    running = req(0, with_suffix(1, 2))
    c.admitted(running)
    share = c.match(req(1, with_suffix(1, 3)))
    assert share.source is running and share.length == 49 and not share.resident
    c.released(running)
    assert c.match(req(2, with_suffix(1, 3))) is None
    same_round = req(3, with_suffix(7))
    assert c.match(req(4, with_suffix(7, 7)), extra=[same_round]).source is same_round


def test_an_entry_is_preferred_to_a_live_source_of_the_same_length():
    c = cache()
    c.admitted(req(0, with_suffix(5)))
    entry = c.add(with_suffix(5))
    assert c.match(req(1, with_suffix(5, 6))).source is entry


def test_exact_mode_restores_only_whole_snapshots_and_pauses_live_sources():
    c = cache(exact=True)
    entry = c.add(SYSTEM)
    assert c.match(req(0, with_suffix(1))).source is entry  # extends the snapshot
    assert c.match(req(1, SYSTEM[:40])) is None  # a prefix of a state is not a state
    c.drop(entry)
    live = req(2, with_suffix(1, 2, 3))
    c.admitted(live)
    share = c.match(req(3, with_suffix(1, 9)))
    assert share.source is live and share.length == 49  # live pauses at 49 (the composer tells it)
    live.cached = 51  # its prefill went past where the prompts part: its state cannot serve 49
    assert c.match(req(4, with_suffix(1, 9))) is None
    assert c.common(req(5, with_suffix(1, 9))) == 49  # so the newcomer pauses there itself


def test_recording_evicts_what_the_new_entry_contains_and_skips_what_is_covered():
    c = cache()
    short = c.add(SYSTEM)
    assert c.plan_record(with_suffix(1, 2)) == [short]  # the longer prompt serves every prefix of it
    c.drop(short)
    longer = c.add(with_suffix(1, 2))
    assert c.plan_record(with_suffix(1)) is None  # covered already
    assert c.plan_record(SYSTEM[:10]) is None  # too short to keep
    assert longer.seq_id in c.entries


def test_the_budget_evicts_least_recently_used_but_never_a_protected_entry():
    c = cache(budget=120, slots=3)
    a = c.add(np.arange(0, 50, dtype=np.int32))
    b = c.add(np.arange(100, 150, dtype=np.int32))
    c.touch(a)  # a is now the most recently used
    assert c.plan_record(np.arange(200, 250, dtype=np.int32)) == [b]
    assert c.plan_record(np.arange(200, 250, dtype=np.int32), protected={b.seq_id}) == [a]
    assert c.plan_record(np.arange(200, 250, dtype=np.int32), protected={a.seq_id, b.seq_id}) is None
    assert c.plan_record(np.arange(0, 130, dtype=np.int32)) is None  # bigger than the whole budget
    assert c.lru() is b and c.lru(protected={b.seq_id}) is a


def test_reserved_ids_are_reused_only_after_their_entry_is_dropped():
    c = cache(slots=2)
    a, b = c.add(SYSTEM), c.add(with_suffix(1))
    assert {a.seq_id, b.seq_id} == {10, 11}
    assert c.plan_record(np.arange(300, 340, dtype=np.int32)) == [a]  # no free id: the oldest goes
    c.drop(a)
    c.drop(a)  # twice is harmless and frees nothing else
    assert c.add(np.arange(300, 340, dtype=np.int32)).seq_id == 10 and len(c.entries) == 2


def test_a_request_still_waiting_for_its_own_share_is_no_source():
    """Two waiters could otherwise pick each other when their common source goes away."""
    from skippy.scheduling.prefix import Share

    c = cache()
    waiting = req(0, with_suffix(1))
    waiting.share = Share(req(9, with_suffix(2)), 48)  # promised, not yet copied in
    c.admitted(waiting)
    assert c.match(req(1, with_suffix(1, 5))) is None
    waiting.share = None  # once it holds its cells (or computes them itself) it is a source again
    assert c.match(req(1, with_suffix(1, 5))).source is waiting
