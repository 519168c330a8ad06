"""Workloads: exact lengths, the shared system prompt, seeded reproducibility."""

from __future__ import annotations

import pytest

from bench.gate.workloads import Lengths, Vocab, make_prompts, make_workload, workload_names

pytestmark = pytest.mark.bench

VOCAB = Vocab(normal_ids=tuple(range(10, 60)), bos=1)


def test_mixes_and_lengths():
    lengths = Lengths(short_in=32, mid_in=96, long_in=128, short_out=8, long_out=64, shared_fraction=0.5)
    names = ("chat", "rag", "rag512", "gen", "long")
    assert [(w.input_len, w.output_len) for w in map(lambda n: make_workload(n, lengths), names)] \
        == [(32, 8), (128, 8), (96, 8), (32, 64), (128, 64)]
    assert make_workload("rag512").input_len == 512 and make_workload("rag").input_len == 1024
    assert make_workload("chat", lengths).shared_len == 0
    assert make_workload("rag-shared", lengths).shared_len == 64
    assert set(workload_names()) == {"chat", "chat-shared", "rag", "rag-shared", "rag512", "rag512-shared", "gen",
                                     "gen-shared", "long",
                                     "long-shared", "bimodal", "bimodal-shared"}
    with pytest.raises(ValueError):
        make_workload("nope")


def test_prompts_have_exact_length_bos_and_only_normal_ids():
    w = make_workload("chat", Lengths(short_in=32))
    prompts = make_prompts(w, VOCAB, 5, seed=0)
    assert [len(p) for p in prompts] == [32] * 5
    assert all(p[0] == 1 and set(p[1:]) <= set(VOCAB.normal_ids) for p in prompts)
    no_bos = make_prompts(w, Vocab(VOCAB.normal_ids, None), 2, seed=0)
    assert [len(p) for p in no_bos] == [32, 32] and all(t >= 10 for p in no_bos for t in p)


def test_shared_prefix_is_shared_and_the_rest_unique():
    w = make_workload("chat-shared", Lengths(short_in=32, shared_fraction=0.75))
    prompts = make_prompts(w, VOCAB, 4, seed=3)
    warm = make_prompts(w, VOCAB, 2, seed=3, stream="warmup")
    head = prompts[0][: 1 + w.shared_len]
    assert all(p[: 1 + w.shared_len] == head for p in prompts + warm)  # BOS + system prompt, warm-up too
    tails = {tuple(p[1 + w.shared_len:]) for p in prompts + warm}
    assert len(tails) == 6  # unique suffixes, warm-up included


def test_same_seed_same_prompts_other_seed_other_prompts():
    w = make_workload("rag", Lengths(long_in=64))
    assert make_prompts(w, VOCAB, 3, seed=7) == make_prompts(w, VOCAB, 3, seed=7)
    assert make_prompts(w, VOCAB, 3, seed=7) != make_prompts(w, VOCAB, 3, seed=8)
    assert make_prompts(w, VOCAB, 3, seed=7) != make_prompts(make_workload("long", Lengths(long_in=64)), VOCAB, 3, 7)



def test_bimodal_is_chat_with_a_seeded_share_of_documents():
    lengths = Lengths(short_in=32, short_out=8, doc_in=256, doc_share=0.1)
    w = make_workload("bimodal", lengths)
    assert (w.input_len, w.output_len, w.doc_len, w.max_input_len) == (32, 8, 256, 256)
    prompts = make_prompts(w, VOCAB, 400, seed=1)
    sizes = [len(p) for p in prompts]
    assert set(sizes) == {32, 256} and 20 <= sizes.count(256) <= 60  # about 10% documents
    assert all(p[0] == 1 and set(p[1:]) <= set(VOCAB.normal_ids) for p in prompts)
    assert make_prompts(w, VOCAB, 400, seed=1) == prompts
    assert [len(p) for p in make_prompts(w, VOCAB, 400, seed=2)] != sizes  # which ones are documents is seeded
    assert make_workload("chat", lengths).doc_len == 0
    assert {len(p) for p in make_prompts(make_workload("bimodal-shared", lengths), VOCAB, 50, seed=1)} == {32, 256}
