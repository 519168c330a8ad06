"""DRY and mirostat v1 against llama.cpp's own samplers, on SmolLM2's real vocabulary.

llama.cpp's sampler objects are reached through cffi's ABI mode (dlopen of the same libllama the
extension links, so one copy of the library): the extension declares only what Skippy calls. The
vocabulary pointer comes from the engine's runtime. DRY: the same history accepted by both, the
penalties equal to the bit (float32 logits after). Mirostat v1: llama.cpp draws with its own RNG, so
each step compares how many candidates it kept and which, then feeds its pick to our mu update;
a wrong mu would show as a different k on a later step."""

from __future__ import annotations

import cffi
import numpy as np
import pytest
import trio

import skippy
from skippy import sampling
from skippy.native._build import locate
from skippy.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.native

CDEF = """
typedef int32_t llama_token;
typedef struct llama_token_data { llama_token id; float logit; float p; } llama_token_data;
typedef struct llama_token_data_array { llama_token_data * data; size_t size; int64_t selected; bool sorted; }
    llama_token_data_array;
struct llama_sampler;
struct llama_vocab;
struct llama_sampler * llama_sampler_init_dry(const struct llama_vocab * vocab, float dry_multiplier, float dry_base,
    int32_t dry_allowed_length, int32_t dry_penalty_last_n, const char ** seq_breakers, size_t num_breakers);
struct llama_sampler * llama_sampler_init_mirostat(int32_t n_vocab, uint32_t seed, float tau, float eta, int32_t m);
void llama_sampler_accept(struct llama_sampler * smpl, llama_token token);
void llama_sampler_apply(struct llama_sampler * smpl, llama_token_data_array * cur_p);
void llama_sampler_free(struct llama_sampler * smpl);
"""


@pytest.fixture(scope="module")
def llama(native_build):
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(locate().lib_dir / "libllama.so"))


def _array(ffi, logits: np.ndarray):
    data = ffi.new("llama_token_data[]", logits.size)
    for i, x in enumerate(logits.tolist()):
        data[i].id, data[i].logit, data[i].p = i, x, 0.0
    arr = ffi.new("llama_token_data_array *", {"data": data, "size": logits.size, "selected": -1, "sorted": False})
    return data, arr


def _llama_dry(ffi, lib, vocab, history, logits, breakers, multiplier, base, allowed, last_n) -> np.ndarray:
    keep = [ffi.new("char[]", b.encode()) for b in breakers]
    ptrs = ffi.new("const char *[]", keep)
    smpl = lib.llama_sampler_init_dry(vocab, multiplier, base, allowed, last_n, ptrs, len(keep))
    try:
        for t in history:
            lib.llama_sampler_accept(smpl, int(t))
        data, arr = _array(ffi, logits)
        lib.llama_sampler_apply(smpl, arr)
        out = np.empty(arr.size, np.float32)
        for i in range(arr.size):
            out[arr.data[i].id] = arr.data[i].logit
        return out
    finally:
        lib.llama_sampler_free(smpl)


async def test_dry_penalties_are_llama_cpps_on_a_real_vocabulary(smollm2_path, llama):
    ffi, lib = llama
    text = ("User: Tell me about the cat.\nAssistant: The cat sat on the mat. \"The cat sat on the mat,\" "
            "said the cat. *The cat sat on the mat.*\nUser: The cat sat on the mat: the cat sat on the")
    with trio.fail_after(120):
        async with skippy.open_engine(smollm2_path, n_ctx=256, n_batch=64, threads=1) as engine:
            rt = engine.runtime
            vocab = ffi.cast("struct llama_vocab *", int(rt._tok._ffi.cast("uintptr_t", rt._tok._vocab)))
            history = rt.tokenize(text, add_special=False).tolist()
            rng = np.random.default_rng(0)
            cases = [((), 0.8, 1.75, 2, 64), (("\n", ":", '"', "*"), 0.8, 1.75, 2, 64),
                     (("\n", "User:", "the mat"), 1.3, 2.0, 1, 40), (("cat",), 0.5, 1.1, 3, 200)]
            penalized = 0
            for breakers, multiplier, base, allowed, last_n in cases:
                pairs = engine._breaker_pairs(tuple(breakers)) if breakers else ()
                for cut in (len(history), len(history) - 7, 30):
                    logits = rng.normal(size=rt.n_vocab).astype(np.float32)
                    want = _llama_dry(ffi, lib, vocab, history[:cut], logits, breakers, multiplier, base, allowed,
                                      last_n)
                    p = SamplingParams(temperature=0, dry_multiplier=multiplier, dry_base=base,
                                       dry_allowed_length=allowed, dry_penalty_last_n=last_n,
                                       dry_sequence_breakers=breakers, dry_breakers=pairs)
                    got = Sampler(p, history[:cut]).shape(logits).astype(np.float32)
                    assert np.array_equal(got, want), (breakers, cut, np.flatnonzero(got != want)[:8])
                    penalized += int((want != logits).sum())
            assert penalized > 5  # the text repeats: the comparison saw real penalties (14 here)
            # the table holds llama.cpp's restart sequences: the newline and colon tokens are breakers
            table = dict(engine._breaker_pairs(("\n", ":")))
            assert table[int(rt.tokenize("\n", add_special=False)[0])] == ()


def test_mirostat_v1_keeps_what_llama_cpp_keeps_and_follows_its_mu(llama):
    ffi, lib = llama
    n, tau, eta = 4096, 3.0, 0.25
    smpl = lib.llama_sampler_init_mirostat(n, 7, tau, eta, 100)
    p = SamplingParams(temperature=1.0, mirostat=1, mirostat_tau=tau, mirostat_eta=eta)
    rng = np.random.default_rng(1)
    mu, sizes = 2 * tau, set()
    try:
        for step in range(60):
            logits = (rng.normal(size=n) * rng.uniform(0.5, 4)).astype(np.float32)
            data, arr = _array(ffi, logits)
            lib.llama_sampler_apply(smpl, arr)
            kept_llama = sorted(arr.data[i].id for i in range(arr.size))
            chosen = arr.data[arr.selected].id
            order = sampling.best_first(logits, n)
            k = sampling.mirostat_k(sampling.softmax_best_first(logits[order]), mu, n)
            assert k == arr.size, (step, k, arr.size, mu)
            assert sorted(order[:k].tolist()) == kept_llama
            rank = int(np.flatnonzero(order[:k] == chosen)[0])
            mu = sampling.mirostat_mu(sampling.softmax_best_first(logits[order[:k]]), rank, mu, p)
            sizes.add(k)
    finally:
        lib.llama_sampler_free(smpl)
    assert len(sizes) > 5  # k moved with mu and the logits' shapes: the comparison was not one case
