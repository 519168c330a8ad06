"""Frames over any trio byte stream: the link between two neighbouring stages.

A stage has several tasks sending on one link (its scheduler's steps, releases, errors),
so sends are serialised whole-frame. Receiving is cancel-safe: a frame is consumed from
the buffer only once all of it has arrived, so a cancelled receive() loses nothing.
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

import trio

from ..errors import SkippyError
from ._frames import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE, FrameError, Message, decode_header, decode_payload, encode

_MIN_READ = 1 << 16
_MAX_READ = 1 << 20  # SocketStream allocates max_bytes per call: don't ask for a whole 64 MiB frame
_TLS_CLOSE_S = 1.0  # a TLS close sends close_notify: a peer that reads nothing must not hold it

if TYPE_CHECKING:
    from ._tls import LinkTLS


class StageDisconnected(SkippyError):
    """The neighbouring stage went away mid-frame or broke the connection: the link is dead."""


class FrameStream(trio.abc.AsyncResource):
    """Whole messages over a ``trio.abc.Stream``.

    ``max_frame_bytes`` bounds one frame (header + payload); a larger one is refused from
    its header, before any of its payload is awaited.
    """

    def __init__(self, stream: trio.abc.Stream, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._stream = stream
        self._max_frame_bytes = max_frame_bytes
        self._send_lock = trio.Lock()
        self._send_torn = False
        self._buffer = bytearray()
        self._receiving = False
        self._lost_sync: FrameError | None = None

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame received or sent; raised once a peer is admitted (a stage keeps it small before)."""
        return self._max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._max_frame_bytes = value

    @property
    def stream(self) -> trio.abc.Stream:
        """The underlying stream (e.g. for the peer's address)."""
        return self._stream

    async def send(self, msg: Message) -> None:
        """Send one frame; concurrent senders never interleave bytes.

        A send cancelled or failed part-way may have written half a frame, which would
        corrupt every later frame for every request on the link; so from then on every send
        raises StageDisconnected. To cancel requests without tearing the link, send from one
        long-lived task per link (or shield the send yourself).
        """
        frame = encode(msg)
        if len(frame) > self._max_frame_bytes:
            raise FrameError(
                f"refusing to send a {len(frame)}-byte frame: larger than max_frame_bytes={self._max_frame_bytes}",
                resync=True,
            )
        async with self._send_lock:
            if self._send_torn:
                raise StageDisconnected("an earlier send stopped mid-frame: this link can no longer be used")
            self._send_torn = True
            try:
                await self._stream.send_all(frame)
            except trio.BrokenResourceError as exc:
                raise StageDisconnected(f"peer stage disconnected while sending: {exc}") from exc
            self._send_torn = False

    async def receive(self) -> Message | None:
        """The next message, or None when the peer closed cleanly between frames.

        A FrameError with ``resync=True`` consumed only the bad frame: call receive() again.
        With ``resync=False`` the stream has lost its place and every later call raises.
        """
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this FrameStream")
        if self._lost_sync is not None:
            raise FrameError(f"stream lost frame sync earlier: {self._lost_sync}", resync=False)
        self._receiving = True
        try:
            if not await self._fill(HEADER_SIZE, eof_ok=True):
                return None
            try:
                kind, length = decode_header(bytes(self._buffer[:HEADER_SIZE]), self._max_frame_bytes)
            except FrameError as exc:
                self._lost_sync = exc
                raise
            await self._fill(HEADER_SIZE + length, eof_ok=False)
            with memoryview(self._buffer) as view:
                payload = bytes(view[HEADER_SIZE : HEADER_SIZE + length])
            del self._buffer[: HEADER_SIZE + length]
            return decode_payload(kind, payload)
        finally:
            self._receiving = False

    async def _fill(self, n: int, *, eof_ok: bool) -> bool:
        """Buffer at least n bytes; False on EOF with nothing buffered when that is allowed."""
        while len(self._buffer) < n:
            missing = n - len(self._buffer)
            try:
                data = await self._stream.receive_some(min(max(missing, _MIN_READ), _MAX_READ))
            except trio.BrokenResourceError as exc:
                raise StageDisconnected(f"peer stage connection broke: {exc}") from exc
            if not data:
                if eof_ok and not self._buffer:
                    return False
                raise StageDisconnected(f"peer stage closed mid-frame: {len(self._buffer)} of {n} bytes arrived")
            self._buffer += data
        return True

    async def aclose(self) -> None:
        if not isinstance(self._stream, trio.SSLStream):
            await self._stream.aclose()
            return
        # bounded, so a caller's shielded close never hangs (on a timeout trio closes the socket itself)
        with trio.move_on_after(_TLS_CLOSE_S):
            try:
                await self._stream.aclose()
            except (trio.BrokenResourceError, ssl.SSLError):
                pass  # the socket is closed either way


def peer_address(stream: trio.abc.Stream) -> str:
    """'host:port' of the peer of a TCP (or TLS over TCP) stream, '?' if it has none."""
    inner = getattr(stream, "transport_stream", stream)
    try:
        host, port = inner.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "?"


async def connect(host: str, port: int, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                  tls: LinkTLS | None = None) -> FrameStream:
    """A FrameStream to a neighbouring stage over TCP, or over TLS with `tls` (the handshake, the
    certificate and its name checked, is done here: a failure is a StageDisconnected saying why).

    TCP_NODELAY: a decode step's frames are small and latency-bound; Nagle would hold them.
    """
    stream = await trio.open_tcp_stream(host, port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
    if tls is None:
        return FrameStream(stream, max_frame_bytes=max_frame_bytes)
    secure = trio.SSLStream(stream, tls.context, server_hostname=tls.name_for(host))
    try:
        await secure.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(stream)
        why = exc.__cause__ or exc
        raise StageDisconnected(f"TLS handshake with {host}:{port} failed: {why}") from exc
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return FrameStream(secure, max_frame_bytes=max_frame_bytes)
