"""What the HTTP fuzz found, pinned: bodies that used to get a 500 (and an ERROR with a traceback)
now get a 400 with OpenAI's error body. Pure protocol, no server."""

from __future__ import annotations

import json

import pytest

from skippy.server import protocol as P

pytestmark = pytest.mark.server

OK = {"model": "m", "prompt": [1, 2], "max_tokens": 2}


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in the parser
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
    b'{"model": "\\ud800", "prompt": "x"}',  # a lone surrogate: no reply, tokenizer or log can carry it
    b'{"model": "m", "prompt": "\\udfff"}',
    b'{"\\uDBFF": 1, "model": "m", "prompt": "x"}',  # in a key
    b'{"model": "m", "prompt": ["a", {"b": ["\\ud83d"]}]}',  # deep inside
    b'{"model": "m", "prompt": "\xed\xa0\x80"}',  # an encoded surrogate (not UTF-8)
    '{"model": "m", "prompt": "x"}'.encode("utf-16"),  # JSON on the wire is UTF-8
], ids=["deep-list", "deep-object", "surrogate-model", "surrogate-prompt", "surrogate-key", "surrogate-deep",
        "encoded-surrogate", "utf-16"])
def test_unparseable_bodies_are_a_400(body):
    with pytest.raises(P.ApiError) as caught:
        P.parse_json(body)
    assert caught.value.status == 400 and caught.value.code == "invalid_json"
    json.dumps(caught.value.body()).encode()  # the answer itself is encodable


def test_surrogate_pairs_and_escaped_backslashes_are_text():
    assert P.parse_json(b'{"p": "\\ud83d\\ude00 \\\\ud800"}') == {"p": "\U0001F600 \\ud800"}


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty"])
def test_huge_integers_for_number_fields_are_a_400_naming_them(name):
    body = json.dumps({**OK, name: 10**400}).encode()
    with pytest.raises(P.ApiError) as caught:
        P.parse_completion(P.parse_json(body))
    assert caught.value.status == 400 and caught.value.param == name


def test_a_huge_integer_bias_is_clamped():
    call = P.parse_completion({**OK, "logit_bias": {"5": 10**400, "6": -10**400}})
    assert call.sampling["logit_bias"] == {5: 100.0, 6: -100.0}
