"""A streamed response's token chunks written from the engine step that produced them.

Streamed the ASGI way, each token wakes the response's task, resumes the SSE generator and goes down
starlette's, hypercorn's and h11's send chain: about a quarter of the event loop's Python calls per
token at N=1 (bench/results/inline-writes), CPU that a 2-core box takes from ggml's threads. Once the
response has started, `InlineWriter.take` (a GenerationStream.divert target) renders the token's
chunk, frames it as h11's body writer for this response would, and writes it to the socket beside
the next decode (see When, below).

Why it stays exact:
- It applies only to a plain-TCP HTTP/1.x connection served by skippy's patched hypercorn (the
  connection is known from `_hypercorn_trio.CONNECTION`) whose response is sending a chunked or
  HTTP/1.0 body; elsewhere (TLS, HTTP/2, no patch) `for_this_response` is None and nothing changes.
- The tap hands it events only while the response's task waits with nothing queued, and it writes
  only while the connection's send lock is free, so no write of the task's can be interleaved.
- Bytes the socket does not take at once wait in `backlog`, and the writer refuses every event
  after them: those queue for the task, which writes the backlog (`flush`) before its own bytes.
- The last event always goes to the task, which ends the response as before. A peer that has gone
  is left to the task too: its next write fails, and the disconnect watcher cancels the request.

When: while the engine's next step already computes (`Engine.step_in_flight`: chained decoding,
e.g. every token but the first and last at N=1), at once. Otherwise the next step is composed and
launched after its predecessor's tokens are routed, and a write made then would delay its decode:
the bytes wait in the backlog and go out right after the engine hands that step to the worker
(`Engine.after_next_step_start`), all of that step's streams in one pass, beside the decode.

From the worker thread: while every running stream is written inline, the engine runs steady steps
ahead of the event loop (scheduling.run_ahead) and `take` is called on the worker thread, between
two decodes, as each token is sampled. Those writes go to a dup of the socket's fd (`_WorkerSocket`,
made here on the event loop): the event loop closing the connection meanwhile can never make one
reach another connection that reuses the number; `close`, at the response's end, waits out a write
in progress.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import trio

from ._hypercorn_trio import CONNECTION, _send_now


def _framing(connection: Any) -> Callable[[bytes], bytes] | None:
    """How h11 frames body bytes on `connection` now: chunked, or as-is for HTTP/1.0 (the same bytes
    as its `send(Data(...))`, without its state machine's dozen calls per write), or None."""
    import h11

    try:
        from h11._writers import ChunkedWriter, Http10Writer
    except ImportError:  # h11 reorganised: leave every write to it
        return None
    if type(connection) is not h11.Connection or connection.our_state is not h11.SEND_BODY:
        return None
    writer = type(getattr(connection, "_writer", None))
    if writer is ChunkedWriter:
        return lambda body: b"%x\r\n%b\r\n" % (len(body), body)
    if writer is Http10Writer:
        return lambda body: body
    return None


class _WorkerSocket:
    """The connection as a run ahead writes it from the worker thread (scheduling.run_ahead): a dup of
    its socket's fd, made on the event loop, so that the event loop closing the connection (the client
    left) can never make a write reach another connection that reuses the fd's number; the lock keeps
    `close` out of a write in progress. Non-blocking, as the socket it shares is."""

    def __init__(self, stream: Any) -> None:
        self._lock = threading.Lock()
        fd = stream.socket.fileno()
        self._fd = os.dup(fd) if fd >= 0 else -1

    def send(self, data: bytes) -> int:
        with self._lock:
            if self._fd < 0:
                return 0
            try:
                return os.write(self._fd, data)
            except BlockingIOError:
                return 0
            except OSError as exc:  # EPIPE, ECONNRESET: the task's write of the backlog finds out
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class InlineWriter:
    def __init__(self, server: Any, frame: Callable[[bytes], bytes], render: Callable[[Any], bytes],
                 written: Callable[[Any], None], engine: Any) -> None:
        self._server, self._frame, self._render, self._written = server, frame, render, written
        self._engine = engine
        self._loop_thread = threading.get_ident()
        self._worker_socket = _WorkerSocket(server.stream)  # for writes from a run ahead (closed by close())
        self.backlog = b""  # rendered, not written yet: deferred to the next step's start, or refused
        self._refused = False  # the socket did not take all of it: the response's task writes it
        self._deferred: list[Any] = []  # the events whose bytes wait for the next step's start
        self._write_deferred = self.write_deferred  # one bound method, handed to the engine per step

    @classmethod
    def for_this_response(cls, scope: dict[str, Any], render: Callable[[Any], bytes],
                          written: Callable[[Any], None], engine: Any) -> "InlineWriter | None":
        """The writer for the response the calling task is sending (it has started: its headers are
        out), or None where this path does not apply."""
        server = CONNECTION.get()
        if server is None or scope.get("http_version") not in ("1.0", "1.1"):
            return None
        if type(getattr(server, "stream", None)) is not trio.SocketStream:  # TLS and the like
            return None
        frame = _framing(getattr(getattr(getattr(server, "protocol", None), "protocol", None), "connection", None))
        return None if frame is None else cls(server, frame, render, written, engine)

    def take(self, event: Any) -> bool:
        """Write `event`'s chunk now or once the next step starts (True), or leave it to the
        response's task (False)."""
        if self._refused or self._server.send_lock.locked():
            return False
        body = self._render(event)
        if not body:  # e.g. a token held back while it may begin a stop string
            return True
        self.backlog += self._frame(body)
        if self._engine.step_in_flight:  # chained: the next decode already computes
            self._write(event)
        else:  # the next step is composed after this: write once it computes
            if not self._deferred:
                self._engine.after_next_step_start(self._write_deferred)
            self._deferred.append(event)
        return True

    def write_deferred(self) -> None:
        events, self._deferred = self._deferred, []
        if self.backlog and not self._refused:
            if self._server.send_lock.locked():  # the task is writing: it takes the rest
                self._refused = True
                return
            self._write(*events)

    def _write(self, *events: Any) -> None:
        data, self.backlog = self.backlog, b""
        try:
            if threading.get_ident() == self._loop_thread:
                sent = _send_now(self._server.stream, data)
            else:  # a run ahead, on the worker thread
                sent = self._worker_socket.send(data)
        except trio.BrokenResourceError:
            sent = 0  # the peer has gone: the task's write of the backlog finds out
        if sent < len(data):
            self.backlog, self._refused = data[sent:], True
        for event in events:
            self._written(event)

    def close(self) -> None:
        """The response has ended: no more writes, from any thread."""
        self._refused = True
        self._worker_socket.close()

    async def flush(self) -> None:
        """Write the backlog, waiting for the socket to take it (the response's task, first thing)."""
        self._deferred = []
        if self.backlog:
            from hypercorn.events import RawData

            data, self.backlog = self.backlog, b""
            await self._server.protocol_send(RawData(data=data))
        self._refused = False


def counted(metrics: Any) -> Callable[[Any], None]:
    """What an inline write tells the server's metrics: one more inline write, and its token's
    sampling -> bytes written (the delivery histogram)."""
    observe = metrics.delivery.observe

    def written(event: Any) -> None:
        metrics.writes_inline += 1
        if event.t_sampled:
            observe(time.perf_counter() - event.t_sampled)

    return written
