"""The stage frame codec: every message round-trips bit-exactly, and malformed bytes of any
shape raise FrameError (never anything else) with the right ``resync`` verdict."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from skippy.errors import InvalidInputError
from skippy.staged import (
    HEADER_SIZE,
    Activations,
    Auth,
    StepEnd,
    Error,
    FrameError,
    Hello,
    Kind,
    Open,
    Release,
    Token,
    decode,
    decode_header,
    decode_payload,
    encode,
)

pytestmark = pytest.mark.staged

# Spelled out here rather than imported, so a silent change to the wire format fails a test.
HEADER = struct.Struct("<4sHHQ")
U64_MAX = 2**64 - 1


def activations(dtype=np.float32, n_tokens: int = 3, n_embd: int = 4, **fields) -> Activations:
    hidden = np.arange(n_tokens * n_embd, dtype=dtype).reshape(n_tokens, n_embd) / 7
    fields = {"request_id": 7, "chunk": 2, "want_logits": True, **fields}
    return Activations(positions=np.arange(10, 10 + n_tokens, dtype=np.int32), hidden=hidden.astype(dtype), **fields)


def header(kind: int, length: int, magic: bytes = b"SKPF", version: int = 3) -> bytes:
    return HEADER.pack(magic, version, kind, length)


def payload_of(msg) -> bytes:
    return encode(msg)[HEADER_SIZE:]


EXAMPLES = {
    "hello": Hello(1, 3, 2, 4, 6, 128, "sha256:ünïcode-✓"),
    "hello-capacity": Hello(0, 2, 0, 3, 6, 128, "d", lanes=32, cells=4096),
    "open-empty": Open(1, {}),
    "open-params": Open(U64_MAX, {"temperature": 0.7, "seed": 1, "stop": ["\n", "終"], "logit_bias": {"5": -1.5}}),
    "activations-f32": activations(np.float32),
    "activations-f16": activations(np.float16, n_tokens=1, n_embd=64, want_logits=False, request_id=U64_MAX),
    "activations-special-values": Activations(
        1, 0, np.array([0], np.int32), np.array([[np.nan, -np.inf, -0.0, 1e-45]], np.float32), False
    ),
    "token-running": Token(U64_MAX, 511, 4095, None),
    "token-finished": Token(3, 2, 9, "stop"),
    "token-empty-finish": Token(3, 2, 9, ""),
    "activations-sampled": activations(np.float32, sampling=(0.7, 40, 0.9, 0.05, 0.123456789)),
    "step-end": StepEnd(U64_MAX, 3),
    "release": Release(U64_MAX, "cancelled by client — 😴"),
    "error-global": Error(0, "oom", "stage 2 ran out of KV cells"),
    "hello-nonce": Hello(0, 2, 0, 3, 6, 128, "d", nonce=bytes(range(32))),
    "auth-challenge": Auth(b"\x01" * 32, b"\x02" * 32),
    "auth-proof": Auth(b"\xff" * 32),
}


@pytest.mark.parametrize("msg", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_every_message_round_trips(msg):
    frame = encode(msg)
    kind, length = decode_header(frame[:HEADER_SIZE])
    assert (kind, length) == (msg.KIND, len(frame) - HEADER_SIZE)
    assert decode_payload(kind, frame[HEADER_SIZE:]) == msg


def test_wire_format_is_pinned():
    assert encode(Release(1, "x")) == header(Kind.RELEASE, 13) + struct.pack("<QI", 1, 1) + b"x"
    assert encode(StepEnd(5, 2)) == header(Kind.STEP_END, 12) + struct.pack("<QI", 5, 2)
    sampled = activations(n_tokens=1, n_embd=1, sampling=(1.0, 2, 0.5, 0.0, 0.25))
    assert payload_of(sampled)[:24 + 36] == struct.pack("<QIIIBBH", 7, 2, 1, 1, 0, 1, 1) + struct.pack(
        "<dIddd", 1.0, 2, 0.5, 0.0, 0.25)


@pytest.mark.parametrize("sampling", [(1.0, 2, 0.5, 0.0), (1.0, -1, 0.5, 0.0, 0.2), (1.0, 2.0, 0.5, 0.0, 0.2), [1.0, 2, 0.5, 0.0, 0.2]])
def test_bad_sampling_is_refused(sampling):
    with pytest.raises(FrameError, match="sampling"):
        activations(sampling=sampling)


def test_sampling_needs_want_logits():
    with pytest.raises(FrameError, match="without want_logits"):
        activations(want_logits=False, sampling=(1.0, 2, 0.5, 0.0, 0.2))


def test_hello_capacity_defaults_to_unsaid():
    hello = decode(encode(Hello(1, 3, 2, 4, 6, 128, "d")))
    assert (hello.lanes, hello.cells) == (0, 0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_decoded_hidden_keeps_dtype_shape_and_is_a_read_only_view(dtype):
    decoded = decode(encode(activations(dtype, n_tokens=5, n_embd=8)))
    assert decoded.hidden.dtype == dtype and decoded.hidden.shape == (5, 8) and decoded.n_tokens == 5
    assert not decoded.hidden.flags.writeable


def test_equality_is_bitwise_and_sees_dtype():
    assert activations(np.float32) != activations(np.float16)
    assert activations(np.float32) != activations(np.float32, chunk=3)


# -- malformed headers: the stream has lost its place


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (header(Kind.TOKEN, 17, magic=b"HTTP"), "bad magic"),
        (header(Kind.TOKEN, 17, version=1), "unsupported frame version 1"),
        (header(Kind.TOKEN, 17)[:-1], "header is 15 bytes"),
        (header(Kind.ACTIVATIONS, 2**64 - 1), "larger than the configured maximum"),
    ],
    ids=["magic", "version", "short", "too-large"],
)
def test_bad_header_cannot_resync(data, problem):
    with pytest.raises(FrameError, match=problem) as caught:
        decode_header(data)
    assert caught.value.resync is False
    assert isinstance(caught.value, InvalidInputError)


def test_maximum_counts_the_whole_frame():
    assert decode_header(header(Kind.TOKEN, 84), max_frame_bytes=100) == (Kind.TOKEN, 84)
    with pytest.raises(FrameError, match="101 bytes is larger than the configured maximum 100"):
        decode_header(header(Kind.TOKEN, 85), max_frame_bytes=100)


def test_frame_shorter_than_its_header_says_cannot_resync():
    with pytest.raises(FrameError, match="its header says") as caught:
        decode(encode(EXAMPLES["token-finished"])[:-1])
    assert caught.value.resync is False


# -- malformed payloads: the frame's extent was valid, so the stream goes on


def _patched(msg, offset: int, value: int) -> bytes:
    payload = bytearray(payload_of(msg))
    payload[offset] = value
    return bytes(payload)


BAD_PAYLOADS = {
    "unknown-kind": (99, b"abc", "unknown frame kind 99"),
    "activations-short": (Kind.ACTIVATIONS, payload_of(activations())[:-1], "hidden needs 48 bytes, only 47 left"),
    "activations-trailing": (Kind.ACTIVATIONS, payload_of(activations()) + b"\0", "1 trailing bytes"),
    "activations-dtype": (Kind.ACTIVATIONS, _patched(activations(), 20, 7), "unknown hidden dtype code 7"),
    "activations-flags": (Kind.ACTIVATIONS, _patched(activations(), 21, 2), "corrupt flags"),
    "activations-no-tokens": (
        Kind.ACTIVATIONS, struct.pack("<QIIIBBH", 1, 0, 0, 4, 0, 0, 0), "must be \\[n_tokens=0 > 0",
    ),
    "open-not-json": (Kind.OPEN, struct.pack("<QI", 1, 3) + b"{x}", "params are not JSON"),
    "open-nan": (Kind.OPEN, struct.pack("<QI", 1, 3) + b"NaN", "params are not JSON"),
    "open-not-object": (Kind.OPEN, struct.pack("<QI", 1, 2) + b"[]", "must be a JSON object"),
    "release-not-utf8": (Kind.RELEASE, struct.pack("<QI", 1, 2) + b"\xff\xfe", "reason is not UTF-8"),
    "release-short-text": (Kind.RELEASE, struct.pack("<QI", 1, 9) + b"abc", "reason needs 9 bytes"),
    "token-finish-flag": (Kind.TOKEN, _patched(EXAMPLES["token-running"], 16, 2), "finish flag 2"),
    "hello-stage": (Kind.HELLO, _patched(EXAMPLES["hello"], 0, 3), "stage 3 of 3 stages"),
    "hello-empty-range": (Kind.HELLO, _patched(EXAMPLES["hello"], 12, 2), "layers \\[2, 2\\) of 6"),
    "error-missing-message": (Kind.ERROR, struct.pack("<QI", 0, 3) + b"oom", "message length needs 4 bytes"),
    "auth-short-mac": (Kind.AUTH, struct.pack("<II", 0, 3) + b"abc", "Auth.mac: expected bytes of length 32"),
    "auth-huge-length": (Kind.AUTH, struct.pack("<I", 2**32 - 1), "nonce needs 4294967295 bytes"),
}


@pytest.mark.parametrize(("kind", "payload", "problem"), BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_bad_payload_can_resync(kind, payload, problem):
    with pytest.raises(FrameError, match=problem) as caught:
        decode_payload(kind, payload)
    assert caught.value.resync is True


# -- values that cannot be framed are refused when built or encoded, naming the field

BAD_VALUES = {
    "negative-id": (lambda: Release(-1, "x"), "Release.request_id=-1"),
    "id-overflow": (lambda: Token(2**64, 1, 1, None), "Token.request_id=18446744073709551616"),
    "bool-as-int": (lambda: Token(1, True, 1, None), "Token.token=True"),
    "numpy-int": (lambda: Token(1, np.int64(4), 1, None), "Token.token=.*expected an integer"),
    "bytes-as-text": (lambda: Error(0, b"oom", "x"), "Error.code=b'oom': expected str"),
    "positions-int64": (lambda: Activations(1, 0, np.zeros(2, np.int64), np.zeros((2, 4), np.float32), True),
                        "positions must be a 1-D int32 array, got int64"),
    "hidden-f64": (lambda: activations(np.float64), "hidden must be a 2-D float32 or float16 array, got float64"),
    "hidden-1d": (lambda: Activations(1, 0, np.zeros(2, np.int32), np.zeros(2, np.float32), True), "2-D"),
    "token-count": (lambda: Activations(1, 0, np.zeros(3, np.int32), np.zeros((2, 4), np.float32), True),
                    "n_tokens=3"),
    "want-logits-int": (lambda: activations(want_logits=1), "want_logits=1: expected bool"),
    "params-list": (lambda: Open(1, [1]), "must be a JSON object"),
    "params-nan": (lambda: encode(Open(1, {"t": float("nan")})), "not plain JSON"),
    "params-object": (lambda: encode(Open(1, {"t": object()})), "not plain JSON"),
    "lone-surrogate": (lambda: encode(Release(1, "\ud800")), "not encodable as UTF-8"),
    "short-nonce": (lambda: Hello(0, 1, 0, 1, 2, 4, "d", nonce=b"x" * 31), "Hello.nonce: expected bytes of length 0 or 32"),
    "mac-missing": (lambda: Auth(b""), "Auth.mac: expected bytes of length 32, got 0"),
    "mac-text": (lambda: Auth("x" * 32), "Auth.mac: .* got str"),
    "not-a-message": (lambda: encode("hello"), "not a frame message"),
}


@pytest.mark.parametrize(("build", "problem"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_unframeable_values_are_refused(build, problem):
    with pytest.raises(FrameError, match=problem):
        build()


# -- properties

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, U64_MAX)
texts = st.text(max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def activations_messages(draw) -> Activations:
    n_tokens, n_embd = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    hidden = draw(hnp.arrays(draw(st.sampled_from([np.float32, np.float16])), (n_tokens, n_embd)))
    positions = draw(hnp.arrays(np.int32, n_tokens))
    return Activations(draw(u64), draw(u32), positions, hidden, draw(st.booleans()))


@st.composite
def hellos(draw) -> Hello:
    n_stages, n_layer = draw(st.integers(1, 2**32 - 1)), draw(st.integers(1, 2**32 - 1))
    begin = draw(st.integers(0, n_layer - 1))
    return Hello(
        draw(st.integers(0, n_stages - 1)), n_stages, begin, draw(st.integers(begin + 1, n_layer)), n_layer,
        draw(st.integers(1, 2**32 - 1)), draw(texts),
    )


messages = st.one_of(
    hellos(),
    st.builds(Open, u64, st.dictionaries(texts, json_values, max_size=4)),
    activations_messages(),
    st.builds(Token, u64, u32, u32, st.none() | texts),
    st.builds(Release, u64, texts),
    st.builds(Error, u64, texts, texts),
    st.builds(Auth, st.binary(min_size=32, max_size=32), st.sampled_from([b"", bytes(32)])),
)


@given(messages)
def test_any_message_round_trips(msg):
    assert decode(encode(msg)) == msg


@given(messages, st.data())
def test_truncated_frames_raise_only_frame_error(msg, data):
    frame = encode(msg)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(FrameError) as caught:
        decode(frame[:cut])
    assert caught.value.resync is False


@given(messages, st.data())
def test_corrupted_frames_raise_only_frame_error(msg, data):
    """Any damage decodes or raises FrameError; damage confined to the payload always resyncs."""
    frame = bytearray(encode(msg))
    spots = data.draw(st.lists(st.integers(0, len(frame) - 1), min_size=1, max_size=4))
    for spot in spots:
        frame[spot] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(frame))
    except FrameError as exc:
        if min(spots) >= HEADER_SIZE:
            assert exc.resync is True
