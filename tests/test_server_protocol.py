"""The server's pure protocol layer (no server, no engine): validation -> engine arguments, response and chunk shapes."""

from __future__ import annotations

import json
import math

import pytest

from skippy.errors import OverloadedError, PromptTooLongError, StageUnavailableError, StepFailedError
from skippy.server import fields as F
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
    ({"model": "m", "prompt": "x", "n": 0}, "n"),
    ({"model": "m", "prompt": ["x"] * 5, "n": 30}, "n"),  # 150 choices
    ({"model": "m", "prompt": "x", "logprobs": 21}, "logprobs"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "best_of": 2}, "best_of"),
    ({"model": "m", "prompt": "x", "echo": "yes"}, "echo"),
    ({"model": "m", "prompt": "x", "temperature": True}, "temperature"),
    ({"model": "m", "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"model": "m", "prompt": "x", "stop": ["a"] * 65}, "stop"),
    ({"model": "m", "prompt": "x", "stop": ["a" * 257]}, "stop"),
    ({"model": "m", "prompt": "x", "seed": -2}, "seed"),
    ({"model": "m", "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "m", "prompt": "x", "frequency_penalty": "1"}, "frequency_penalty"),
    ({"model": "m", "prompt": "x", "repeat_penalty": 0}, "repeat_penalty"),
    ({"model": "m", "prompt": "x", "repetition_penalty": 1.1, "repeat_penalty": 1.1}, "repeat_penalty"),
    ({"model": "m", "prompt": "x", "repeat_last_n": -2}, "repeat_last_n"),
    ({"model": "m", "prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"model": "m", "prompt": "x", "logit_bias": {"1": "x"}}, "logit_bias"),
    ({"model": "m", "prompt": "x", "logit_bias": [1, 2]}, "logit_bias"),
    ({"model": "m", "prompt": "x", "n_predict": 0}, "n_predict"),
    ({"model": "m", "prompt": "x", "max_tokens": 3, "n_predict": 3}, "n_predict"),
    ({"model": "m", "prompt": ["a", [1]]}, "prompt"),
    ({"model": "m", "prompt": ["a", ""]}, "prompt"),
    ({"model": "m", "prompt": [[1], []]}, "prompt"),
    ({"model": "m", "prompt": ["a"] * 129}, "prompt"),
    ({"model": "m", "prompt": []}, "prompt"),
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


def test_a_lost_stage_is_503_with_retry_after_and_other_failures_500():
    """A step that failed because a pipeline stage went away (the cause chain the pipeline
    raises) tells the client to retry; any other failure is the server's."""
    try:
        try:
            raise StageUnavailableError("stage 1 at 127.0.0.1:9 is gone")
        except StageUnavailableError as lost:
            raise StepFailedError("step failed") from lost
    except StepFailedError as failed:
        err = P.generation_failed(failed)
    assert (err.status, err.code, err.headers["Retry-After"]) == (503, "stage_unavailable", "1")
    assert "generation failed" in err.body()["error"]["message"]
    other = P.generation_failed(StepFailedError("llama_decode returned -3"))
    assert (other.status, other.code, other.headers) == (500, "generation_failed", {})
    assert P.generation_failed(None).status == 500


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
    full = P.ResponseShape("completion", "id2", "m", created=1).full([("hey", "stop"), ("yo", "length")], usage)
    assert full["object"] == "text_completion" and full["choices"][0]["text"] == "hey"
    assert [(c["index"], c["finish_reason"]) for c in full["choices"]] == [(0, "stop"), (1, "length")]
    assert shape.chunk("x", index=3)["choices"][0]["index"] == 3
    encode = P.ResponseShape("completion", "id3", "m", created=1).text_event_encoder(False, index=2)
    event = encode('a"b')
    assert event.startswith(b"data: ") and event.endswith(b"\r\n\r\n")
    assert json.loads(event[6:])["choices"][0] == {
        "index": 2, "text": 'a"b', "logprobs": None, "finish_reason": None}


# -- tolerant parsing, aliases, new fields ---------------------------------------------------


def test_unknown_fields_are_ignored_and_reported_known_ones_still_strict():
    call = P.parse_completion({"model": "m", "prompt": "x", "frobnicate": 1, "guided_choice": ["a"],
                               "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert call.ignored == ("frobnicate", "guided_choice", "stream_options.continuous_usage_stats")
    assert F.ignored_header(call.ignored) == {
        "x-skippy-ignored-fields": "frobnicate, guided_choice, stream_options.continuous_usage_stats"}
    assert F.ignored_header(["bad\r\nname", "é"]) == {"x-skippy-ignored-fields": "bad??name, ?"}  # header-safe
    assert F.ignored_header([]) == {}
    # known, no effect: not reported; known, unimplemented: still a 400 away from its neutral value
    assert P.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "user": "u",
                         "cache_prompt": True, "tools": []}).ignored == ()
    with pytest.raises(P.ApiError) as err:
        P.parse_completion({"model": "m", "prompt": "x", "frobnicate": 1, "temperature": "hot"})
    assert err.value.body()["error"]["param"] == "temperature"


def test_an_ignored_field_is_logged_once_per_name():
    from loguru import logger

    seen = []
    F._logged.discard("zz_once")
    logger.enable("skippy")
    sink = logger.add(lambda m: seen.append(m.record), level="INFO")
    try:
        for _ in range(3):
            P.parse_completion({"model": "m", "prompt": "x", "zz_once": 1})
    finally:
        logger.remove(sink)
        logger.disable("skippy")
    hits = [r for r in seen if "zz_once" in r["message"]]
    assert len(hits) == 1 and hits[0]["level"].name == "INFO"


def test_llama_server_aliases_and_seed_minus_one():
    call = P.parse_completion({"model": "m", "prompt": "x", "n_predict": 7, "repeat_penalty": 1.3, "repeat_last_n": -1,
                               "seed": -1, "top_k": -1})
    assert call.max_tokens == 7
    assert call.sampling == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
                             "repeat_penalty": 1.3, "repeat_last_n": -1}
    assert P.parse_completion({"model": "m", "prompt": "x", "repetition_penalty": 1.1}).sampling["repeat_penalty"] == 1.1
    assert P.parse_completion({"model": "m", "prompt": "x", "n_predict": -1}).max_tokens is None  # the rest of the context
    chat = P.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "n_predict": 5})
    assert chat.max_tokens == 5
    with pytest.raises(P.ApiError) as err:
        P.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                      "max_completion_tokens": 2})
    assert err.value.param == "max_completion_tokens"


def test_penalties_and_logit_bias_reach_the_sampling_params():
    from skippy.sampling import SamplingParams

    call = P.parse_completion({"model": "m", "prompt": "x", "presence_penalty": 0.5, "frequency_penalty": -1,
                               "logit_bias": {"5": 250, "7": -3.5, "9": -1000}})
    assert call.sampling["logit_bias"] == {5: 100.0, 7: -3.5, 9: -100.0}  # clamped to [-100, 100]
    assert call.shaping_param == "presence_penalty"
    params = SamplingParams(**call.sampling)
    assert params.logit_bias == ((5, 100.0), (7, -3.5), (9, -100.0)) and params.shapes_logits and not params.greedy
    llama = P.parse_completion({"model": "m", "prompt": "x", "logit_bias": [[3, 1.5], [4, False]]})
    assert llama.sampling["logit_bias"] == {3: 1.5, 4: -math.inf}  # false: never this token
    assert P.parse_completion({"model": "m", "prompt": "x", "logit_bias": {}}).shaping_param is None
    P.check_token_ids(call, 10)
    with pytest.raises(P.ApiError) as err:
        P.check_token_ids(call, 9)
    assert err.value.param == "logit_bias"


def test_prompt_lists_and_long_stop_lists():
    texts = P.parse_completion({"model": "m", "prompt": ["a", "b", "c"]})
    assert texts.prompts == ("a", "b", "c")
    ids = P.parse_completion({"model": "m", "prompt": [[1, 2], [3]]})
    assert ids.prompts == ([1, 2], [3]) and P.parse_completion({"model": "m", "prompt": [4, 5]}).prompts == ([4, 5],)
    stops = [f"s{i}" for i in range(64)]
    assert P.parse_completion({"model": "m", "prompt": "x", "stop": stops}).stop == tuple(stops)
    call = P.parse_completion({"model": "m", "prompt": "x", "stop": stops[:62] + ["", "s0"]})
    assert call.stop == tuple(stops[:62])  # empty and repeated ones dropped, order kept
