"""The server's pure protocol layer (no server, no engine): validation -> engine arguments, response and chunk shapes."""

from __future__ import annotations

import pytest

from skippy.errors import OverloadedError, PromptTooLongError
from skippy.server import protocol as P


def test_completion_maps_to_engine_arguments_with_openai_defaults():
    call = P.parse_completion({"model": "m", "prompt": "hi", "stop": "\n", "seed": 3, "top_k": 5,
                               "ignore_eos": True, "priority": 2, "n": 1, "user": "u", "logprobs": None})
    assert call.max_tokens == 16  # OpenAI's default for completions
    kw = call.engine_kwargs(call.max_tokens)
    assert kw["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 5, "min_p": 0.0, "seed": 3}
    assert kw["stop"] == ("\n",) and kw["ignore_eos"] and kw["priority"] == 2
    assert P.parse_completion({"model": "m", "prompt": [[1, 2, 3]][0]}).prompt == [1, 2, 3]
    assert P.parse_completion({"model": "m", "prompt": ["one"]}).prompt == "one"


def test_chat_renders_roles_and_defaults_to_the_rest_of_the_context():
    call = P.parse_chat({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]},
                                                    {"role": "user", "content": "b"}],
                         "stream": True, "stream_options": {"include_usage": True}})
    assert call.prompt == [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
    assert call.include_usage and call.max_tokens is None
    assert P.resolve_max_tokens(call, 100, 1024) == 924
    assert P.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "max_completion_tokens": 7}).max_tokens == 7


@pytest.mark.parametrize("body,param", [
    ({"model": "m", "prompt": "x", "n": 3}, "n"),
    ({"model": "m", "prompt": "x", "best_of": 2}, "best_of"),
    ({"model": "m", "prompt": "x", "bogus": True}, "bogus"),
    ({"model": "m", "prompt": "x", "temperature": True}, "temperature"),
    ({"model": "m", "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop"),
    ({"model": 3, "prompt": "x"}, "model"),
    ({"model": "m"}, "prompt"),
])
def test_rejections_name_the_parameter(body, param):
    with pytest.raises(P.ApiError) as err:
        P.parse_completion(body)
    assert err.value.status == 400 and err.value.body()["error"]["param"] == param


def test_engine_errors_map_to_statuses():
    over = P.engine_error(OverloadedError(4, 4))
    assert over.status == 429 and over.headers["Retry-After"] == "1" and over.type == "rate_limit_error"
    assert P.engine_error(PromptTooLongError("x")).code == "context_length_exceeded"
    assert P.engine_error(RuntimeError("boom")).status == 500
    assert P.shutting_down().status == 503


def test_chunk_shapes():
    shape = P.ResponseShape("chat", "id1", "m", created=1)
    first = shape.chunk("", first=True, include_usage=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"] is None
    last = shape.chunk("", "length")
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    usage = P.usage_json(5, 2)
    assert usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                     "prompt_tokens_details": {"cached_tokens": 0}}
    assert shape.usage_chunk(usage)["choices"] == []
    full = P.ResponseShape("completion", "id2", "m", created=1).full("hey", "stop", usage)
    assert full["object"] == "text_completion" and full["choices"][0]["text"] == "hey"
