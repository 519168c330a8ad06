"""The wire format between stages: versioned, length-checked binary frames (sans-IO).

Why binary and not JSON: an Activations frame carries [n_tokens, n_embd] hidden states
every step, so it must be one copy in and one zero-copy view out. Every frame starts with
a fixed header -- magic b"SKPF", version u16, kind u16, payload length u64, little-endian --
so a receiver can refuse an oversized frame before reading its payload and can skip a bad
payload without losing its place in the stream. Malformed input of any shape raises
FrameError and nothing else; ``resync`` says whether the stream is still usable.
"""

from __future__ import annotations

import enum
import json
import struct
from typing import Any, ClassVar

import attrs
import numpy as np

from ..errors import InvalidInputError

MAGIC = b"SKPF"
VERSION = 3  # 2: StepEnd, the last stage samples (Activations.sampling), Hello carries capacity;
# 3: Hello carries the upstream nonce, Auth frames (the shared-secret challenge-response, _auth)
HEADER_SIZE = 16
DEFAULT_MAX_FRAME_BYTES = 256 << 20  # 2048 tokens x 8192 embd x f32 is 64 MiB; leave room

_HEADER = struct.Struct("<4sHHQ")
_U32 = struct.Struct("<I")
_ACTIVATIONS = struct.Struct("<QIIIBBH")  # request, chunk, n_tokens, n_embd, dtype, want_logits, flags
_SAMPLING = struct.Struct("<dIddd")  # temperature, top_k, top_p, min_p, draw
_HAS_SAMPLING = 1
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<f2")}  # wire dtype codes
_POSITIONS = np.dtype("<i4")


class FrameError(InvalidInputError):
    """A frame (or a message about to be framed) is malformed.

    ``resync`` is False when the header itself was bad: the length cannot be trusted, so the
    stream has lost its place and must be closed. It is True when only the payload (or a
    value to encode) was bad: the frame's extent was valid and the next frame can be read.
    """

    def __init__(self, message: str, *, resync: bool) -> None:
        super().__init__(message)
        self.resync = resync


class Kind(enum.IntEnum):
    HELLO = 1
    OPEN = 2
    ACTIVATIONS = 3
    TOKEN = 4
    RELEASE = 5
    ERROR = 6
    STEP_END = 7
    AUTH = 8


# -- field validators: construction and decoding share them, so a decoded message is always
# -- one that could have been encoded


def _uint(bits: int, **field: Any) -> Any:
    limit = 1 << bits

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise FrameError(
                f"{type(instance).__name__}.{attribute.name}={value!r}: expected an integer in [0, 2**{bits})",
                resync=True,
            )

    return attrs.field(validator=check, **field)


def _instance_of(*types: type) -> Any:
    names = " or ".join("None" if t is type(None) else t.__name__ for t in types)

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, types):
            raise FrameError(f"{type(instance).__name__}.{attribute.name}={value!r}: expected {names}", resync=True)

    return check


_text = _instance_of(str)
NONCE_BYTES = 32  # a fresh random challenge per handshake and side (HMAC-SHA256 keys it)
MAC_BYTES = 32  # HMAC-SHA256


def _blob(*sizes: int) -> Any:
    """A bytes field whose length is one of `sizes` (0: absent)."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, bytes) or len(value) not in sizes:
            raise FrameError(f"{type(instance).__name__}.{attribute.name}: expected bytes of length "
                             f"{' or '.join(map(str, sizes))}, got "
                             f"{len(value) if isinstance(value, bytes) else _describe(value)}", resync=True)

    return attrs.field(default=b"" if 0 in sizes else attrs.NOTHING, validator=check)


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte equality: a round trip must preserve dtype, shape and every bit (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _array_field() -> Any:
    return attrs.field(eq=attrs.cmp_using(eq=_same_array), hash=False)


# -- payload reading and writing


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []

    def pack(self, layout: struct.Struct, *values: int) -> None:
        self.parts.append(layout.pack(*values))

    def text(self, value: str) -> None:
        """u32 byte length, then UTF-8."""
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FrameError(f"string is not encodable as UTF-8: {exc}", resync=True) from None
        self.pack(_U32, len(data))
        self.parts.append(data)

    def array(self, value: np.ndarray, dtype: np.dtype) -> None:
        self.parts.append(memoryview(np.ascontiguousarray(value, dtype=dtype)).cast("B"))

    def blob(self, value: bytes) -> None:
        """u32 byte length, then the bytes."""
        self.pack(_U32, len(value))
        self.parts.append(value)


class _Reader:
    def __init__(self, kind: Kind, payload: bytes) -> None:
        self._kind = kind
        self._view = memoryview(payload)
        self._at = 0

    def fail(self, problem: str) -> FrameError:
        return FrameError(f"{self._kind.name} payload: {problem}", resync=True)

    def take(self, n: int, what: str) -> memoryview:
        if n > len(self._view) - self._at:
            raise self.fail(f"{what} needs {n} bytes, only {len(self._view) - self._at} left")
        self._at += n
        return self._view[self._at - n : self._at]

    def unpack(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size, what))

    def text(self, what: str) -> str:
        (n,) = self.unpack(_U32, f"{what} length")
        try:
            return str(self.take(n, what), "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8: {exc}") from None

    def blob(self, what: str) -> bytes:
        (n,) = self.unpack(_U32, f"{what} length")
        return bytes(self.take(n, what))

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        return np.frombuffer(self.take(count * dtype.itemsize, what), dtype=dtype)

    def end(self) -> None:
        if self._at != len(self._view):
            raise self.fail(f"{len(self._view) - self._at} trailing bytes")


# -- messages: each knows its kind and how to write and read its payload


@attrs.frozen
class Hello:
    """First frame on every connection, both ways: neighbours check they run the same model
    (digest) and hold adjacent layer ranges before any activation flows."""

    KIND: ClassVar[Kind] = Kind.HELLO
    _LAYOUT: ClassVar[struct.Struct] = struct.Struct("<6I")
    _CAPACITY: ClassVar[struct.Struct] = struct.Struct("<2I")

    stage: int = _uint(32)
    n_stages: int = _uint(32)
    layer_begin: int = _uint(32)
    layer_end: int = _uint(32)
    n_layer: int = _uint(32)
    n_embd: int = _uint(32)
    model_digest: str = attrs.field(validator=_text)
    # what this stage and every stage after it can hold (the fewest): sessions and cells. The
    # reply to a Hello carries them so stage 0 derives the pipeline's ceiling; 0 = not said.
    lanes: int = _uint(32, default=0)
    cells: int = _uint(32, default=0)
    # upstream's fresh challenge when it authenticates with the stage secret (see _auth); b"": none
    nonce: bytes = _blob(0, NONCE_BYTES)

    def __attrs_post_init__(self) -> None:
        if not self.stage < self.n_stages:
            raise FrameError(f"Hello: stage {self.stage} of {self.n_stages} stages", resync=True)
        if not self.layer_begin < self.layer_end <= self.n_layer:
            raise FrameError(
                f"Hello: layers [{self.layer_begin}, {self.layer_end}) of {self.n_layer} is empty or out of range",
                resync=True,
            )
        if self.n_embd == 0:
            raise FrameError("Hello: n_embd must be positive", resync=True)

    def _write(self, w: _Writer) -> None:
        w.pack(self._LAYOUT, self.stage, self.n_stages, self.layer_begin, self.layer_end, self.n_layer, self.n_embd)
        w.text(self.model_digest)
        w.pack(self._CAPACITY, self.lanes, self.cells)
        w.blob(self.nonce)

    @classmethod
    def _read(cls, r: _Reader) -> Hello:
        fields = r.unpack(cls._LAYOUT, "fields")
        digest = r.text("model_digest")
        return cls(*fields, digest, *r.unpack(cls._CAPACITY, "capacity"), r.blob("nonce"))


@attrs.frozen
class Open:
    """A request starts: downstream stages learn its id and the last stage its sampling
    parameters (plain JSON values) before its first Activations frame."""

    KIND: ClassVar[Kind] = Kind.OPEN
    _LAYOUT: ClassVar[struct.Struct] = struct.Struct("<Q")

    request_id: int = _uint(64)
    params: dict[str, Any] = attrs.field(hash=False)

    @params.validator
    def _check_params(self, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, dict):
            raise FrameError(f"Open.params must be a JSON object (dict), got {type(value).__name__}", resync=True)

    def _write(self, w: _Writer) -> None:
        try:
            text = json.dumps(self.params, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise FrameError(f"Open.params is not plain JSON: {exc}", resync=True) from None
        w.pack(self._LAYOUT, self.request_id)
        w.text(text)

    @classmethod
    def _read(cls, r: _Reader) -> Open:
        (request_id,) = r.unpack(cls._LAYOUT, "request_id")
        text = r.text("params")
        try:
            params = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise r.fail(f"params are not JSON: {exc}") from None
        return cls(request_id, params)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@attrs.frozen
class Activations:
    """Hidden states of ``n_tokens`` tokens of one request leaving a stage.

    ``chunk`` numbers a request's frames so the next stage can notice loss or reordering;
    ``want_logits`` asks the last stage to sample after the chunk's last token. ``hidden`` is
    float32 or float16 and is never value-checked: any bits a layer produces are passed on.
    A decoded frame's arrays are read-only views of the received payload.
    """

    KIND: ClassVar[Kind] = Kind.ACTIVATIONS

    request_id: int = _uint(64)
    chunk: int = _uint(32)
    positions: np.ndarray = _array_field()
    hidden: np.ndarray = _array_field()
    want_logits: bool = attrs.field(validator=_instance_of(bool))
    # how the last stage samples: (temperature, top_k, top_p, min_p, draw), the draw being the
    # uniform number stage 0's per-request RNG made; None = greedy. Only with want_logits.
    sampling: tuple[float, int, float, float, float] | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        if self.sampling is not None:
            if not self.want_logits:
                raise FrameError("Activations.sampling without want_logits", resync=True)
            ok = isinstance(self.sampling, tuple) and len(self.sampling) == 5 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.sampling)
            if not ok or not isinstance(self.sampling[1], int) or not 0 <= self.sampling[1] < 1 << 32:
                raise FrameError(
                    f"Activations.sampling must be (temperature, top_k, top_p, min_p, draw), got {self.sampling!r}",
                    resync=True)
        p, h = self.positions, self.hidden
        if not isinstance(p, np.ndarray) or p.ndim != 1 or p.dtype != _POSITIONS:
            raise FrameError(f"Activations.positions must be a 1-D int32 array, got {_describe(p)}", resync=True)
        if not isinstance(h, np.ndarray) or h.ndim != 2 or h.dtype not in _DTYPES.values():
            raise FrameError(
                f"Activations.hidden must be a 2-D float32 or float16 array, got {_describe(h)}", resync=True
            )
        if h.shape[0] != p.shape[0] or 0 in h.shape:
            raise FrameError(
                f"Activations: hidden {h.shape} must be [n_tokens={p.shape[0]} > 0, n_embd > 0]", resync=True
            )

    @property
    def n_tokens(self) -> int:
        return int(self.hidden.shape[0])

    def _write(self, w: _Writer) -> None:
        n_tokens, n_embd = self.hidden.shape
        code = next(c for c, dtype in _DTYPES.items() if dtype == self.hidden.dtype)
        flags = _HAS_SAMPLING if self.sampling is not None else 0
        w.pack(_ACTIVATIONS, self.request_id, self.chunk, n_tokens, n_embd, code, self.want_logits, flags)
        if self.sampling is not None:
            w.pack(_SAMPLING, *self.sampling)
        w.array(self.positions, _POSITIONS)
        w.array(self.hidden, _DTYPES[code])

    @classmethod
    def _read(cls, r: _Reader) -> Activations:
        request_id, chunk, n_tokens, n_embd, code, want_logits, flags = r.unpack(_ACTIVATIONS, "header")
        if code not in _DTYPES:
            raise r.fail(f"unknown hidden dtype code {code} (known: {sorted(_DTYPES)})")
        if want_logits > 1 or flags & ~_HAS_SAMPLING:
            raise r.fail(f"want_logits={want_logits}, flags={flags}: corrupt flags")
        sampling = r.unpack(_SAMPLING, "sampling") if flags & _HAS_SAMPLING else None
        positions = r.array(_POSITIONS, n_tokens, "positions")
        hidden = r.array(_DTYPES[code], n_tokens * n_embd, "hidden").reshape(n_tokens, n_embd)
        return cls(request_id, chunk, positions, hidden, bool(want_logits), sampling)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__


@attrs.frozen
class Token:
    """The last stage sampled ``token`` at ``position`` for a request; ``finish`` names why
    the request ended on it (None while it goes on). Sent back to stage 0."""

    KIND: ClassVar[Kind] = Kind.TOKEN
    _LAYOUT: ClassVar[struct.Struct] = struct.Struct("<QIIB")

    request_id: int = _uint(64)
    token: int = _uint(32)
    position: int = _uint(32)
    finish: str | None = attrs.field(validator=_instance_of(str, type(None)))

    def _write(self, w: _Writer) -> None:
        w.pack(self._LAYOUT, self.request_id, self.token, self.position, self.finish is not None)
        if self.finish is not None:
            w.text(self.finish)

    @classmethod
    def _read(cls, r: _Reader) -> Token:
        request_id, token, position, has_finish = r.unpack(cls._LAYOUT, "fields")
        if has_finish > 1:
            raise r.fail(f"finish flag {has_finish} is neither 0 nor 1")
        return cls(request_id, token, position, r.text("finish") if has_finish else None)


@attrs.frozen
class Release:
    """A request ended or was cancelled: every stage frees its cells and recurrent state."""

    KIND: ClassVar[Kind] = Kind.RELEASE
    _LAYOUT: ClassVar[struct.Struct] = struct.Struct("<Q")

    request_id: int = _uint(64)
    reason: str = attrs.field(validator=_text)

    def _write(self, w: _Writer) -> None:
        w.pack(self._LAYOUT, self.request_id)
        w.text(self.reason)

    @classmethod
    def _read(cls, r: _Reader) -> Release:
        (request_id,) = r.unpack(cls._LAYOUT, "request_id")
        return cls(request_id, r.text("reason"))


@attrs.frozen
class Error:
    """A stage failed; ``request_id`` 0 means the failure is not about one request."""

    KIND: ClassVar[Kind] = Kind.ERROR
    _LAYOUT: ClassVar[struct.Struct] = struct.Struct("<Q")

    request_id: int = _uint(64)
    code: str = attrs.field(validator=_text)
    message: str = attrs.field(validator=_text)

    def _write(self, w: _Writer) -> None:
        w.pack(self._LAYOUT, self.request_id)
        w.text(self.code)
        w.text(self.message)

    @classmethod
    def _read(cls, r: _Reader) -> Error:
        (request_id,) = r.unpack(cls._LAYOUT, "request_id")
        return cls(request_id, r.text("code"), r.text("message"))


@attrs.frozen
class StepEnd:
    """Closes a micro-batch: the ``n_frames`` Activations frames before it are decoded together.

    Downstream it follows a micro-batch's frames; upstream it follows the Token frames the last
    stage sampled for that micro-batch (``n_frames`` of them). Each micro-batch gets exactly
    one answer, this or an Error, in the order the micro-batches were sent."""

    KIND: ClassVar[Kind] = Kind.STEP_END
    _LAYOUT: ClassVar[struct.Struct] = struct.Struct("<QI")

    step: int = _uint(64)
    n_frames: int = _uint(32)

    def _write(self, w: _Writer) -> None:
        w.pack(self._LAYOUT, self.step, self.n_frames)

    @classmethod
    def _read(cls, r: _Reader) -> StepEnd:
        return cls(*r.unpack(cls._LAYOUT, "fields"))


@attrs.frozen
class Auth:
    """One step of the shared-secret handshake after a Hello (see _auth): the stage's proof and
    challenge (``mac`` and ``nonce``), then upstream's proof (``mac`` alone)."""

    KIND: ClassVar[Kind] = Kind.AUTH

    mac: bytes = _blob(MAC_BYTES)
    nonce: bytes = _blob(0, NONCE_BYTES)

    def _write(self, w: _Writer) -> None:
        w.blob(self.nonce)
        w.blob(self.mac)

    @classmethod
    def _read(cls, r: _Reader) -> Auth:
        nonce = r.blob("nonce")
        return cls(r.blob("mac"), nonce)


Message = Hello | Open | Activations | Token | Release | Error | StepEnd | Auth
_CLASSES: dict[int, type[Message]] = {
    cls.KIND: cls for cls in (Hello, Open, Activations, Token, Release, Error, StepEnd, Auth)}


# -- the codec


def encode(msg: Message) -> bytes:
    """One frame: header then payload."""
    if type(msg) not in _CLASSES.values():
        raise FrameError(f"cannot encode {type(msg).__name__}: not a frame message", resync=True)
    w = _Writer()
    msg._write(w)
    length = sum(len(part) for part in w.parts)
    return b"".join([_HEADER.pack(MAGIC, VERSION, msg.KIND, length), *w.parts])


def decode_header(header: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[int, int]:
    """(kind, payload length) of a frame's first HEADER_SIZE bytes.

    The kind is not checked here: a frame of an unknown kind has a trustworthy length, so
    decode_payload refuses it with ``resync=True`` and the stream goes on.
    """
    if len(header) != HEADER_SIZE:
        raise FrameError(f"frame header is {len(header)} bytes, expected {HEADER_SIZE}", resync=False)
    magic, version, kind, length = _HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}, expected {MAGIC!r}: not a Skippy stage stream", resync=False)
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version} (this build speaks {VERSION})", resync=False)
    if HEADER_SIZE + length > max_frame_bytes:
        raise FrameError(
            f"frame of {HEADER_SIZE + length} bytes is larger than the configured maximum {max_frame_bytes}",
            resync=False,
        )
    return kind, length


def decode_payload(kind: int, payload: bytes) -> Message:
    """The message in a payload whose length the header already vouched for."""
    try:
        cls = _CLASSES[kind]
    except KeyError:
        raise FrameError(f"unknown frame kind {kind} (known: {sorted(_CLASSES)})", resync=True) from None
    r = _Reader(cls.KIND, payload)
    msg = cls._read(r)
    r.end()
    return msg


def decode(frame: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    """The message in exactly one whole frame (header + payload)."""
    kind, length = decode_header(frame[:HEADER_SIZE], max_frame_bytes)
    if len(frame) != HEADER_SIZE + length:
        raise FrameError(f"frame is {len(frame)} bytes, its header says {HEADER_SIZE + length}", resync=False)
    return decode_payload(kind, frame[HEADER_SIZE:])
