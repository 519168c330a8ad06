"""20 json_schema requests (nested objects, arrays, enums, required fields) on the real default models
(SmolLM2, Gemma-3): sampled (temperature 0.7, a seed each), streamed and not, all at once; every output
validates against its schema and stops on its own, and each request sent alone gives the same bytes
(batch-invariant engines: the grammar masks the same invariant logits whatever shares the batch)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import trio

from ._live import live_server

pytestmark = [pytest.mark.server, pytest.mark.native]

MODEL = "test-model"
MAX_TOKENS = 96
MAX_CHARS = 80  # the longest compact instance of any schema: well inside MAX_TOKENS


def obj(required: dict, optional: dict | None = None) -> dict:
    """A strict object: the given properties, `required` ones required, nothing else."""
    return {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required),
            "additionalProperties": False}


def text(n: int) -> dict:
    return {"type": "string", "maxLength": n}


def integer(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def array(items: dict, lo: int, hi: int) -> dict:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


def enum(*values) -> dict:
    return {"enum": list(values)}


BOOL = {"type": "boolean"}

# (prompt, schema): every instance is short (test_every_schema_is_bounded_and_valid), so the sampled output ends
# on the grammar's own end well before MAX_TOKENS; no unbounded `number` (a small model may emit digits
# of a fraction until the limit)
CASES = [
    ("Describe a user account as JSON.",
     obj({"name": text(12), "age": integer(0, 120), "role": enum("admin", "user", "guest")})),
    ("Give a point on a grid as JSON.", obj({"x": integer(-99, 99), "y": integer(-99, 99)})),
    ("Describe a color as JSON.",
     obj({"name": enum("red", "green", "blue"), "rgb": array(integer(0, 255), 3, 3)})),
    ("Describe a book as JSON.",
     obj({"title": text(16), "year": integer(1900, 2025),
          "tags": array(enum("fiction", "history", "science"), 1, 2)})),
    ("Describe a shop order as JSON.",
     obj({"items": array(obj({"sku": text(4), "qty": integer(1, 9)}), 1, 2), "paid": BOOL})),
    ("Describe where a person lives as JSON.",
     obj({"name": text(10), "home": obj({"city": text(10), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("Report the weather as JSON.",
     obj({"city": text(10), "unit": enum("c", "f"), "temp": integer(-50, 50), "sunny": BOOL})),
    ("Give three feature flags as JSON.", obj({"a": BOOL, "b": BOOL, "c": BOOL})),
    ("Give a 2x2 matrix of digits as JSON.", obj({"rows": array(array(integer(0, 9), 2, 2), 2, 2)})),
    ("Schedule a meeting as JSON.",
     obj({"kind": {"const": "meeting"}, "day": enum("mon", "tue", "wed", "thu", "fri"), "hour": integer(8, 18)})),
    ("Give a stock level as JSON.", obj({"count": integer(0, 50), "status": enum("in_stock", "sold_out")})),
    ("Describe a small team as JSON.",
     obj({"lead": obj({"name": text(8), "level": integer(1, 5)}), "members": array(text(6), 1, 3)})),
    ("Answer a health check as JSON.",
     obj({"ok": BOOL, "code": integer(100, 599), "note": {"type": ["string", "null"], "maxLength": 12}})),
    ("Describe a shape as JSON.",
     {"anyOf": [obj({"kind": {"const": "circle"}, "r": integer(1, 9)}),
                obj({"kind": {"const": "square"}, "side": integer(1, 9)})]}),
    ("Give a line segment as JSON.",
     {"$defs": {"pt": obj({"x": integer(0, 9), "y": integer(0, 9)})},
      **obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})}),
    ("Fill in a short survey as JSON.",
     obj({"q1": enum("yes", "no"), "q2": enum("yes", "no"), "score": integer(1, 10)}, {"comment": text(12)})),
    ("List a few colors as JSON.", obj({"colors": array(enum("red", "green", "blue", "black"), 2, 4)})),
    ("Give a server configuration as JSON.",
     obj({"debug": BOOL, "level": enum("low", "mid", "high"), "retries": integer(0, 5),
          "server": obj({"port": integer(1024, 9999), "tls": BOOL})})),
    ("Label a ticket as JSON.",
     obj({"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "labels": array(text(5), 0, 2)})),
    ("Give a deeply nested digit as JSON.", obj({"a": obj({"b": obj({"c": obj({"d": integer(0, 9)})})})})),
]


def longest(schema: dict, defs: dict | None = None) -> int:
    """The most characters a compact instance of `schema` can take (a string's characters counted once):
    an error for anything unbounded."""
    defs = schema.get("$defs", defs or {})
    if "$ref" in schema:
        return longest(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        return max(longest(s, defs) for s in schema["anyOf"])
    if "const" in schema:
        return len(json.dumps(schema["const"]))
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    sizes = []
    for kind in kinds:
        if kind == "object":
            assert schema["additionalProperties"] is False
            props = schema["properties"]
            sizes.append(2 + sum(len(json.dumps(k)) + 1 + longest(v, defs) for k, v in props.items())
                         + max(len(props) - 1, 0))
        elif kind == "array":
            n = schema["maxItems"]
            sizes.append(2 + n * longest(schema["items"], defs) + max(n - 1, 0))
        elif kind == "string":
            sizes.append(2 + (schema["maxLength"] if "maxLength" in schema else
                              len(schema["pattern"].replace("[0-9]", "0").replace("[A-Z]", "A"))))
        elif kind == "integer":
            sizes.append(max(len(str(schema["minimum"])), len(str(schema["maximum"]))))
        else:
            sizes.append({"boolean": 5, "null": 4}[kind])
    return max(sizes)


def test_every_schema_is_bounded_and_valid():
    assert len(CASES) == 20 and len({json.dumps(s, sort_keys=True) for _, s in CASES}) == 20
    for prompt, schema in CASES:
        jsonschema.Draft202012Validator.check_schema(schema)
        assert longest(schema) <= MAX_CHARS, (prompt, longest(schema))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    """Each real model once per module, without repacked weights (batch-invariant engines)."""
    if request.param == "smollm2":
        yield request.getfixturevalue("smollm2")  # conftest's
        return
    from skippy.native import Model

    with Model(request.getfixturevalue(f"{request.param}_path"), repack=False) as m:
        yield m


def _body(i: int, stream: bool, seed: int | None = None) -> dict:
    prompt, schema = CASES[i]
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0.7, "seed": 1000 + i if seed is None else seed, "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": f"case{i}", "schema": schema,
                                                                       "strict": True}}}


async def _ask(http: httpx.AsyncClient, i: int, stream: bool, seed: int | None = None) -> tuple[str, str]:
    """(content, finish_reason) of case i, streamed or not."""
    body = _body(i, stream, seed)
    if not stream:
        r = await http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]
    parts, reason = [], None
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                if chunk["choices"]:
                    parts.append(chunk["choices"][0]["delta"].get("content") or "")
                    reason = chunk["choices"][0]["finish_reason"] or reason
    return "".join(parts), reason


RESEEDED = range(0, len(CASES), 4)  # these cases also run with another seed: sampling must tell


async def test_twenty_schemas_validate_under_concurrency_and_alone_give_the_same_bytes(model):
    """All 20 at once, each streamed and not (and five with a second seed), then each alone (even cases
    streamed, odd not): every output valid and stopped; streamed, not, together and alone: the same bytes."""
    with trio.fail_after(300):  # gemma3: ~70 s of CPU; 150 s seen on a loaded box
        async with live_server(model, n_ctx=4096) as (url, _, _), \
                httpx.AsyncClient(base_url=url, timeout=180) as http:
            together: dict[tuple, tuple[str, str]] = {}

            async def one(i, stream, seed=None):
                together[i, stream, seed] = await _ask(http, i, stream, seed)

            async with trio.open_nursery() as nursery:
                for i in range(len(CASES)):
                    nursery.start_soon(one, i, True)
                    nursery.start_soon(one, i, False)
                for i in RESEEDED:
                    nursery.start_soon(one, i, False, 7)
            for (i, stream, seed), (content, reason) in together.items():
                assert reason == "stop", (i, stream, seed, CASES[i][0], content)
                jsonschema.validate(json.loads(content), CASES[i][1])
            for i in range(len(CASES)):
                assert together[i, True, None] == together[i, False, None], i
            # the temperature is applied under the grammar: another seed picks other tokens somewhere
            assert any(together[i, False, 7] != together[i, False, None] for i in RESEEDED)

            for i in range(len(CASES)):
                stream = i % 2 == 0
                alone = await _ask(http, i, stream)
                assert alone == together[i, stream, None], (i, CASES[i][0], alone, together[i, stream, None])
