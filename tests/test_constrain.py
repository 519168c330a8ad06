"""Constrained decoding (skippy.constrain): the grammar's mask per sampled row, the matcher advanced once
per token and rolled back with the Sampler, preemption by recompute, and JSON schemas on the real model."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import trio

from skippy.constrain import GrammarError, GrammarSpec, compile_grammar
from skippy.runtime import sample_rows
from skippy.sampling import Sampler, SamplingParams
from skippy.testing import FakeRuntime, open_fake_engine

# -- scheduling logic over the fake runtime (its vocabulary: token t spells chr(ord('a') + t % 26), 0 ends) --


def _fake_grammar(rt: FakeRuntime, regex: str = "[a-e]{3,12}"):
    return compile_grammar(rt, GrammarSpec("regex", regex))


def _letters(rt: FakeRuntime, tokens) -> str:
    return b"".join(rt.piece(t) for t in tokens).decode()


async def _run(engine, prompt, grammar, **kw):
    events = [e async for e in engine.generate(prompt, {"temperature": 1.0, "seed": 11}, max_tokens=40,
                                               grammar=grammar, **kw)]
    return [e.token for e in events if e.token is not None], events[-1].finish_reason


async def test_a_grammar_holds_every_token_and_ends_with_stop_when_complete():
    rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    grammar = _fake_grammar(rt)
    with trio.fail_after(10):
        async with open_fake_engine(rt) as engine:
            tokens, reason = await _run(engine, [1, 2, 3], grammar)
    assert reason == "stop" and tokens[-1] == 0  # the matcher allowed only EOS once the regex was done
    text = _letters(rt, tokens[:-1])
    assert 3 <= len(text) <= 12 and set(text) <= set("abcde"), text


async def test_preemption_by_recompute_gives_the_same_constrained_output():
    """The matcher lives with the request's Sampler: recomputing its tokens does not advance it again."""
    solo_rt = FakeRuntime(n_ctx=512, n_batch=16, n_seq_max=4)
    prompts = [[(i * 13 + 5 * k) % 60 + 1 for k in range(10)] for i in range(4)]
    with trio.fail_after(20):
        async with open_fake_engine(solo_rt) as engine:
            grammar = _fake_grammar(solo_rt, "[a-z]{30}")
            solo = [await _run(engine, p, grammar) for p in prompts]
        rt = FakeRuntime(n_ctx=64, n_batch=16, n_seq_max=4)
        grammar = _fake_grammar(rt, "[a-z]{30}")
        async with open_fake_engine(rt, decode_reserve=2, max_preemptions=3) as engine:
            out = [None] * len(prompts)

            async def one(i):
                out[i] = await _run(engine, prompts[i], grammar)

            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
            assert engine.stats().preemptions > 0
    assert out == solo


def test_a_failed_step_rolls_the_matcher_back_with_the_rng():
    rt = FakeRuntime(n_vocab=64)
    grammar = _fake_grammar(rt, "[a-z]{20}")
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((40, 64)).astype(np.float32)
    a, b = Sampler(SamplingParams(temperature=1.0, seed=3)), Sampler(SamplingParams(temperature=1.0, seed=3))
    a.constraint, b.constraint = grammar.constraint(), grammar.constraint()
    for x in rows[:5]:
        assert a(x) == b(x)
    saved = a.state()
    for x in rows[5:9]:  # a step whose results were lost: drawn, then put back
        a(x)
    a.restore(saved)
    assert [a(x) for x in rows[5:25]] == [b(x) for x in rows[5:25]]
    assert a.constraint.state() == b.constraint.state()


def test_constrained_rows_leave_the_vectorised_greedy_path_and_unconstrained_ones_alone():
    rt = FakeRuntime(n_vocab=64)
    logits = np.zeros((2, 64), dtype=np.float32)
    logits[:, 1] = 5.0  # 'b': greedy's pick
    logits[:, 3] = 4.0  # 'd'
    plain, held = Sampler(SamplingParams()), Sampler(SamplingParams())
    held.constraint = _fake_grammar(rt, "[c-f]+").constraint()
    assert plain.greedy and not held.greedy
    assert sample_rows(logits, [plain, held]).tolist() == [1, 3]
    # (rng, history kept, picks counted, mirostat's mu, grammar state): the vectorised argmax took plain's
    # row, and nothing is grammar-shaped
    assert plain.state()[1:3] == (0, 0) and plain.state()[-1] is None


def test_grammars_that_cannot_compile_say_why():
    rt = FakeRuntime(n_vocab=64)
    with pytest.raises(GrammarError, match="nope"):
        compile_grammar(rt, GrammarSpec("json_schema", {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}))
    with pytest.raises(GrammarError, match="not found|undefined|unknown"):
        compile_grammar(rt, GrammarSpec("grammar", 'root ::= "a" | missing'))
    with pytest.raises(GrammarError):
        compile_grammar(rt, GrammarSpec("json_schema", {"type": "object", "unknownKeyword": 1, "minProperties": "x"}))
    with pytest.raises(GrammarError):
        GrammarSpec("yaml", "a")


# -- the real model ----------------------------------------------------------------------------------

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            "address": {"type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 24},
                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"], "additionalProperties": False},
        },
        "required": ["name", "age", "colors", "address"],
        "additionalProperties": False,
    },
    "inventory": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "minItems": 1, "maxItems": 3,
                      "items": {"type": "object",
                                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "state": {"enum": ["new", "used"]}},
                                "required": ["sku", "count", "state"], "additionalProperties": False}},
            "ok": {"type": "boolean"},
        },
        "required": ["items", "ok"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from skippy.native import Model

    with Model(smollm2_path, repack=False) as model:
        yield model


@pytest.mark.native
async def test_json_schemas_hold_under_concurrency_and_match_their_solo_runs(smollm2):
    import skippy

    with trio.fail_after(240):
        async with skippy.open_engine(smollm2, n_ctx=4096, n_batch=64, threads=4) as engine:
            grammars = {k: await trio.to_thread.run_sync(compile_grammar, engine.runtime, GrammarSpec("json_schema", s))
                        for k, s in SCHEMAS.items()}
            prompt = engine.chat_tokens([{"role": "user", "content": "Answer with a JSON object."}])
            specs = [(name, seed, temp) for name in SCHEMAS for seed, temp in ((1, 0.0), (2, 0.8), (3, 1.0))]

            async def run(name, seed, temp):
                stream = engine.generate(prompt, {"temperature": temp, "seed": seed}, max_tokens=300,
                                         grammar=grammars[name])
                events = [e async for e in stream]
                return "".join(e.text for e in events).encode(), events[-1].finish_reason

            together: dict = {}

            async def one(spec):
                together[spec] = await run(*spec)

            async with trio.open_nursery() as nursery:
                for spec in specs:
                    nursery.start_soon(one, spec)
            for spec in specs[::2]:  # alone: the same bytes as under load
                assert await run(*spec) == together[spec], spec
    for (name, _, _), (text, reason) in together.items():
        assert reason == "stop", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
