"""A stage after the first: its own layers, context, lanes and scheduler, served over TCP (or TLS).

One upstream session at a time (the newest admitted connection wins: a restarted stage 0
must not wait for a dead one's socket). A connection is admitted once its Hello checks out:
with a stage secret, upstream proved it (see _auth), and its model and layers match; a peer
refused there is logged and displaces nothing. A session is a chain: on Hello the stage
connects to the next stage, and whatever breaks (either neighbour gone, a malformed frame) ends the session here,
which ends it upstream too; every cell the session held is freed. The stage itself keeps
serving: the next Hello starts a fresh session, so the pipeline recovers when a stage returns.

The stage's scheduler: requests take its own sequence ids (StageLanes); the micro-batches
that arrive while it computes are coalesced into one decode up to n_batch tokens (a slower
stage catches up by batching more, which is the backpressure of the pipeline: its inbox is
bounded, so TCP holds the stages above it).
"""

from __future__ import annotations

import os
import ssl
from collections import deque
from typing import Any

import attrs
import numpy as np
import trio
from loguru import logger

from .._plan import size_context
from ..errors import InvalidInputError, NoKvSlotError, SkippyError
from ..native import Batch, Context, Model
from ..runtime import file_digest
from ..sampling import SamplingParams, pick
from ..scheduling.lanes import LanePlan
from ._auth import check_upstream, say_hello, send_refusal
from ._frames import DEFAULT_MAX_FRAME_BYTES, Activations, Error, FrameError, Hello, Open, Release, StepEnd, Token
from ._microbatch import SESSION_ENDING, NoLaneError, ReplyOrder, StageLanes, UnknownRequestError
from ._tls import LinkTLS
from ._transport import FrameStream, StageDisconnected, connect, peer_address

HELLO_TIMEOUT_S = 30.0  # for a whole handshake (TLS, the Hello and, with a secret, the proof)
HANDSHAKE_MAX_FRAME_BYTES = 64 << 10  # before a peer is admitted it may not make the stage buffer more
MAX_HANDSHAKES = 64  # connections still in their handshake; more are dropped at once
INBOX_FRAMES = 256  # frames read ahead from upstream; past it TCP pushes back on the stage above


class StageRuntime:
    """A stage after the first: the model's layers [a, b) fed hidden states, sized on its own node."""

    def __init__(self, path: os.PathLike[str] | str, layers: tuple[int, int], *, n_ctx: int | None = None,
                 n_batch: int = 512, n_seq_max: int | None = None, memory_bytes: int | None = None,
                 threads: int | None = None, batch_invariant: bool = True, floor_ctx_per_session: int = 128) -> None:
        self.model = Model(path, repack=not batch_invariant, layers=tuple(layers))
        try:
            if not self.model.takes_hidden:
                raise InvalidInputError(f"layers {tuple(layers)} start at layer 0: that is stage 0, which serves the "
                                        "requests (skippy stage with --layers 0:B runs the API front)")
            self.plan: LanePlan
            self.plan, options = size_context(self.model, n_ctx=n_ctx, n_batch=n_batch, threads=threads,
                                              batch_invariant=batch_invariant, memory_bytes=memory_bytes,
                                              n_seq_max=n_seq_max, floor_ctx_per_session=floor_ctx_per_session)
            self.ctx = Context(self.model, options)
        except BaseException:
            self.model.close()
            raise
        self.layers = self.model.layers
        self.last = not self.model.returns_hidden
        logger.info("stage {}: {} n_ctx={} n_batch={} ceiling={} ({})", self.layers, self.model.arch, self.ctx.n_ctx,
                    n_batch, self.plan.ceiling, self.plan.reason)
        self.n_batch = n_batch
        self.digest = file_digest(self.model.path)
        self._batch = Batch(n_batch)

    @property
    def lanes(self) -> int:
        return self.plan.ceiling

    @property
    def cells(self) -> int:
        return self.ctx.n_ctx

    def decode(self, hidden: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        """Hidden states out (a stage in the middle) or the output rows' logits (the last); a copy."""
        return self.ctx.decode(self._batch.set_hidden(hidden, positions, seq_ids, outputs)).copy()

    def seq_rm(self, seq: int) -> None:
        self.ctx.seq_rm(seq)

    def hello(self, stage: int, n_stages: int, layer_end: int, lanes: int, cells: int) -> Hello:
        return Hello(stage, n_stages, self.layers[0], layer_end, self.model.n_layer, self.model.n_embd, self.digest,
                     lanes=lanes, cells=cells)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


@attrs.define
class SessionStats:
    """Where a stage's time went in one session: busy decoding, or idle waiting for input."""

    layers: tuple[int, int]
    decodes: int = 0
    micro_batches: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    idle_s: float = 0.0

    def line(self) -> str:
        share = self.busy_s / max(1e-9, self.busy_s + self.idle_s)
        return (f"skippy stage: layers {self.layers[0]}:{self.layers[1]}: {self.decodes} decodes of "
                f"{self.micro_batches} micro-batches, {self.tokens} tokens, busy {self.busy_s:.3f} s, "
                f"idle {self.idle_s:.3f} s (busy {share:.0%})")


@attrs.define
class _MicroBatch:
    step: int
    frames: list[Activations]
    problem: Error | None = None
    answer: list = attrs.field(factory=list)  # the last stage's Token frames and StepEnd

    @property
    def n_tokens(self) -> int:
        return sum(f.n_tokens for f in self.frames)


class StageServer:
    def __init__(self, runtime: StageRuntime, next_addr: tuple[str, int] | None, *,
                 connect_timeout: float = 10.0, on_session_end: Any = None, secret: bytes | None = None,
                 next_tls: LinkTLS | None = None) -> None:
        self.runtime = runtime
        self.on_session_end = on_session_end  # called with a SessionStats
        self.next_addr = next_addr
        self.connect_timeout = connect_timeout
        self.secret = secret  # the stage secret (see _auth): upstream must prove it, and so must the next stage
        self.next_tls = next_tls  # reach the next stage over TLS, checking its certificate (see _tls)
        self._lock = trio.Lock()
        self._scope: trio.CancelScope | None = None
        self._admitting = 0
        self.sessions = 0
        self.refused = 0

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One upstream connection. Only once its Hello checks out (the secret proven, the model and
        layers matching) does it cancel the current session: the newest *good* connection wins (a
        restarted stage 0 must not wait for a dead one's socket; a stranger must not displace it)."""
        up = FrameStream(stream, max_frame_bytes=HANDSHAKE_MAX_FRAME_BYTES)
        if self._admitting >= MAX_HANDSHAKES:
            logger.warning("stage {}: {} handshakes already pending: dropping {}", self.runtime.layers,
                           self._admitting, _peer(up))
            await trio.aclose_forcefully(up)
            return
        self._admitting += 1
        try:
            hello = await self._admit(up)
        finally:
            self._admitting -= 1
        if hello is None:
            self.refused += 1
            with trio.CancelScope(shield=True):
                await up.aclose()
            return
        up.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        if self._scope is not None:
            self._scope.cancel()
        async with self._lock:
            with trio.CancelScope() as self._scope:
                self.sessions += 1
                session = _UpstreamSession(self, up)
                try:
                    await session.run(hello)
                # except*: the session's nursery groups them (a neighbour's reset, a TLS peer gone
                # without close_notify); either way the session ends here and the stage serves on
                except* (StageDisconnected, trio.BrokenResourceError, trio.ClosedResourceError) as ended:
                    logger.info("stage {}: session ended: {}", self.runtime.layers, ended.exceptions[0])
                except* Exception as failed:  # a bug in one session must not take the stage down
                    exc = failed.exceptions[0]
                    logger.opt(exception=failed).error("stage {}: session failed: {!r}", self.runtime.layers, exc)
                    await send_refusal(up, Error(0, "stage_failed", f"stage {self.runtime.layers}: {exc!r}"))
                finally:
                    with trio.CancelScope(shield=True):
                        await up.aclose()
                    if self.on_session_end is not None and session.stats.decodes:
                        self.on_session_end(session.stats)

    async def _admit(self, up: FrameStream) -> Hello | None:
        """Upstream's Hello, authenticated and matching this stage; None (refused, logged) otherwise."""
        peer = _peer(up)
        refusal: Error | None = None
        try:
            with trio.fail_after(HELLO_TIMEOUT_S):
                if not await self._tls_handshake(up, peer):
                    return None
                hello = await up.receive()
                if not isinstance(hello, Hello):
                    refusal = Error(0, "bad_hello", f"expected Hello first, got {type(hello).__name__}")
                else:
                    refusal = await check_upstream(up, hello, self.secret, peer)
        except FrameError as exc:
            refusal = Error(0, "bad_frame", f"a malformed frame in the handshake: {exc}")
        except trio.TooSlowError:
            logger.warning("stage {}: refused {}: no handshake within {} s", self.runtime.layers, peer,
                           HELLO_TIMEOUT_S)
            return None
        except (StageDisconnected, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            logger.info("stage {}: {} left during the handshake: {}", self.runtime.layers, peer, exc)
            return None
        if refusal is None:
            assert isinstance(hello, Hello)
            problem = _mismatch(hello, self.runtime)
            if problem is None:
                return hello
            refusal = Error(0, "bad_hello", problem)
        if refusal.code != "unauthenticated":  # check_upstream logged those
            logger.warning("stage {}: refusing a session from {}: {}", self.runtime.layers, peer, refusal.message)
        await send_refusal(up, refusal)
        return None

    async def _tls_handshake(self, up: FrameStream, peer: str) -> bool:
        """On a TLS link, the TLS handshake first: a plaintext peer (or one that rejects this
        stage's certificate) fails it, is logged and refused (no frame can reach it)."""
        if not isinstance(up.stream, trio.SSLStream):
            return True
        try:
            await up.stream.do_handshake()
        except trio.BrokenResourceError as exc:
            logger.warning("stage {}: refused {}: TLS handshake failed: {}", self.runtime.layers, peer,
                           exc.__cause__ or exc)
            return False
        return True


class _UpstreamSession:
    """One session from the stage above: its lanes, reply order and the connection to the next stage."""

    def __init__(self, server: StageServer, up: FrameStream) -> None:
        self.server, self.rt, self.up = server, server.runtime, up
        self.down: FrameStream | None = None
        self.lanes = StageLanes(self.rt.lanes)
        self.refused: dict[int, Error] = {}
        self.order = ReplyOrder()
        self.partial: list[Activations] = []
        self.up_lock = trio.Lock()
        self.stats = SessionStats(self.rt.layers)

    async def run(self, hello: Hello) -> None:
        try:
            if not await self._greet(hello):
                return
            async with trio.open_nursery() as nursery:
                inbox_tx, inbox_rx = trio.open_memory_channel(INBOX_FRAMES)
                nursery.start_soon(self._read_up, inbox_tx, nursery.cancel_scope)
                nursery.start_soon(self._compute, inbox_rx)
                if self.down is not None:
                    nursery.start_soon(self._read_down, nursery.cancel_scope)
        finally:
            for _, seq in self.lanes.held():
                self.rt.seq_rm(seq)
            if self.down is not None:
                with trio.CancelScope(shield=True):
                    await self.down.aclose()

    # -- the handshake: check the neighbour, reach the next stage, say what the rest can hold

    async def _greet(self, hello: Hello) -> bool:
        """Upstream's Hello was admitted (StageServer._admit): reach the next stage, answer with what the rest holds."""
        rt = self.rt
        lanes, cells, end, n_stages = rt.lanes, rt.cells, rt.layers[1], hello.stage + 2
        if self.server.next_addr is not None:
            host, port = self.server.next_addr
            try:
                with trio.fail_after(self.server.connect_timeout):
                    self.down = await connect(host, port, tls=self.server.next_tls)
                    reply = await say_hello(self.down, rt.hello(hello.stage + 1, hello.stage + 2, rt.layers[1], 0, 0),
                                            self.server.secret, f"{host}:{port}")
            except (OSError, StageDisconnected, FrameError, trio.TooSlowError) as exc:
                await self._refuse(f"stage {hello.stage + 2} at {host}:{port} is unreachable: {exc}",
                                   code="stage_unreachable")
                return False
            if isinstance(reply, Error):
                await self.up.send(reply)
                return False
            if not isinstance(reply, Hello) or reply.layer_begin != rt.layers[1]:
                await self._refuse(f"stage {hello.stage + 2} at {host}:{port} answered {reply!r}")
                return False
            lanes, cells = min(lanes, reply.lanes), min(cells, reply.cells)
            end, n_stages = reply.layer_end, reply.n_stages
        elif rt.layers[1] != rt.model.n_layer:
            await self._refuse(f"this stage ends at layer {rt.layers[1]} of {rt.model.n_layer} and has no --next",
                               code="stage_unreachable")
            return False
        await self.up.send(rt.hello(hello.stage + 1, n_stages, end, lanes, cells))
        logger.info("stage {}: session {} from {} (pipeline holds {} sessions, {} cells)", rt.layers,
                    self.server.sessions, _peer(self.up), lanes, cells)
        return True

    async def _refuse(self, message: str, code: str = "bad_hello") -> None:
        logger.warning("stage {}: refusing a session: {}", self.rt.layers, message)
        await self.up.send(Error(0, code, message))

    # -- reading: upstream into the inbox, answers from below back up

    async def _read_up(self, inbox: trio.MemorySendChannel, session: trio.CancelScope) -> None:
        async with inbox:
            while True:
                try:
                    msg = await self.up.receive()
                except FrameError as exc:
                    # the session ends (the micro-batch it belonged to cannot be completed); the stage lives on
                    async with self.up_lock:
                        await self.up.send(Error(0, "bad_frame", f"stage at layers {self.rt.layers}: {exc}"))
                    break
                if msg is None:
                    break
                await inbox.send(msg)
        session.cancel()

    async def _read_down(self, session: trio.CancelScope) -> None:
        assert self.down is not None
        tokens: list = []
        try:
            while True:
                msg = await self.down.receive()
                if msg is None:
                    raise StageDisconnected("it closed the connection")
                if isinstance(msg, Token):
                    tokens.append(msg)
                    continue
                if isinstance(msg, Error) and msg.code in SESSION_ENDING:
                    raise _Relay(msg)
                self.order.from_below([*tokens, msg])
                tokens = []
                await self._send_up()
        except (StageDisconnected, FrameError) as exc:
            host, port = self.server.next_addr
            error = Error(0, "stage_lost", f"the stage after layers {self.rt.layers} ({host}:{port}) is gone: {exc}")
            await self._send_up_now(error)
        except _Relay as relay:
            await self._send_up_now(relay.error)
        session.cancel()

    async def _send_up(self) -> None:
        async with self.up_lock:
            for frame in self.order.ready():
                await self.up.send(frame)

    async def _send_up_now(self, frame: Any) -> None:
        with trio.move_on_after(1.0):
            async with self.up_lock:
                await self.up.send(frame)

    # -- the scheduler: coalesce what has arrived into decodes

    async def _compute(self, inbox: trio.MemoryReceiveChannel) -> None:
        backlog: deque = deque()
        idle_from = trio.current_time()
        async with inbox:
            async for first in inbox:
                self.stats.idle_s += trio.current_time() - idle_from
                backlog.append(first)
                while True:
                    try:
                        backlog.append(inbox.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                group: list[_MicroBatch] = []
                while backlog:
                    msg = backlog.popleft()
                    if isinstance(msg, Activations):
                        self.partial.append(msg)
                    elif isinstance(msg, StepEnd):
                        mb = _MicroBatch(msg.step, self.partial)
                        self.partial = []
                        if len(mb.frames) != msg.n_frames:
                            mb.problem = Error(0, "bad_step", f"step {msg.step}: {len(mb.frames)} frames arrived, "
                                                              f"its StepEnd says {msg.n_frames}")
                        if group and sum(m.n_tokens for m in group) + mb.n_tokens > self.rt.n_batch:
                            await self._run(group)
                            group = []
                        group.append(mb)
                    elif isinstance(msg, Open):
                        await self._open(msg)
                    elif isinstance(msg, Release):
                        if group:
                            await self._run(group)
                            group = []
                        await self._release(msg)
                    else:
                        await self._send_up_now(Error(0, "bad_frame", f"unexpected {type(msg).__name__} from upstream"))
                        return
                if group:
                    await self._run(group)
                idle_from = trio.current_time()

    async def _open(self, msg: Open) -> None:
        try:
            self.lanes.open(msg.request_id)
        except NoLaneError as exc:
            self.refused[msg.request_id] = Error(msg.request_id, "no_lane", f"stage {self.rt.layers}: {exc}")
        if self.down is not None:
            await self.down.send(msg)

    async def _release(self, msg: Release) -> None:
        seq = self.lanes.release(msg.request_id)
        self.refused.pop(msg.request_id, None)
        if seq is not None:
            self.rt.seq_rm(seq)
        if self.down is not None:
            await self.down.send(msg)

    def _rows(self, mb: _MicroBatch) -> list[int] | Error:
        seqs = []
        for f in mb.frames:
            if f.request_id in self.refused:
                return self.refused[f.request_id]
            try:
                seqs.append(self.lanes.seq(f.request_id))
            except UnknownRequestError as exc:
                return Error(f.request_id, "unknown_request", str(exc))
        return seqs

    async def _run(self, group: list[_MicroBatch]) -> None:
        """One decode for the group's good micro-batches; each gets its answer in order."""
        good: list[tuple[_MicroBatch, list[int]]] = []
        for mb in group:
            if mb.problem is None:
                rows = self._rows(mb)
                if isinstance(rows, Error):
                    mb.problem = rows
                else:
                    good.append((mb, rows))
        result: np.ndarray | None = None
        if good:
            frames = [f for mb, _ in good for f in mb.frames]
            hidden = frames[0].hidden if len(frames) == 1 else np.concatenate([f.hidden for f in frames])
            positions = np.concatenate([f.positions for f in frames])
            seq_ids = np.concatenate([np.full(f.n_tokens, s, np.int32) for mb, seqs in good for f, s in zip(mb.frames, seqs)])
            if self.rt.last:
                outputs = np.concatenate([_last_row(f.n_tokens, f.want_logits) for f in frames])
            else:  # a stage before the last hands every row's hidden state down
                outputs = np.ones(len(positions), dtype=bool)
            t0 = trio.current_time()
            try:
                result = await trio.to_thread.run_sync(self.rt.decode, hidden, positions, seq_ids, outputs)
                self.stats.decodes += 1
                self.stats.micro_batches += len(good)
                self.stats.tokens += len(positions)
            except NoKvSlotError as exc:
                self._fail(good, "no_kv_slot", exc)
            except SkippyError as exc:
                logger.warning("stage {}: decode failed: {!r}", self.rt.layers, exc)
                self._fail(good, "decode_failed", exc)
            self.stats.busy_s += trio.current_time() - t0
        if result is not None and self.rt.last:
            self._sample(good, result)
        await self._answer(group, result)

    def _fail(self, good: list, code: str, exc: Exception) -> None:
        for mb, _ in good:
            mb.problem = Error(0, code, f"stage {self.rt.layers}: {exc}")

    async def _forward(self, mb: _MicroBatch, hidden: np.ndarray, row: int) -> int:
        assert self.down is not None
        for f in mb.frames:
            out = hidden[row:row + f.n_tokens].astype(f.hidden.dtype, copy=False)
            row += f.n_tokens
            await self.down.send(Activations(f.request_id, f.chunk, f.positions, out, f.want_logits, f.sampling))
        await self.down.send(StepEnd(mb.step, len(mb.frames)))
        return row

    def _sample(self, good: list, logits: np.ndarray) -> None:
        row = 0
        for mb, _ in good:
            tokens = []
            for f in mb.frames:
                if not f.want_logits:
                    continue
                if f.sampling is None:
                    token = int(np.argmax(logits[row]))
                else:
                    t, k, p, m, u = f.sampling
                    token = pick(logits[row], SamplingParams(t, int(k), p, m), u)
                tokens.append(Token(f.request_id, token, int(f.positions[-1]), None))
                row += 1
            mb.answer = [*tokens, StepEnd(mb.step, len(tokens))]

    async def _answer(self, group: list[_MicroBatch], result: np.ndarray | None) -> None:
        """Each micro-batch's answer takes its place in the order before anything goes down: the
        stage below may answer a forwarded one before the next is even sent."""
        row = 0
        for mb in group:
            if mb.problem is not None:
                self.order.answer_here([mb.problem])
            elif self.rt.last:
                self.order.answer_here(mb.answer)
            else:
                assert result is not None
                self.order.expect_below()
                row = await self._forward(mb, result, row)
        await self._send_up()


class _Relay(Exception):
    def __init__(self, error: Error) -> None:
        self.error = error


def _last_row(n: int, want: bool) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[-1] = want
    return out


def _mismatch(hello: Hello, rt: StageRuntime) -> str | None:
    if hello.model_digest != rt.digest:
        return f"model mismatch: upstream runs {hello.model_digest[:16]}, this stage {rt.digest[:16]}"
    if hello.n_layer != rt.model.n_layer or hello.n_embd != rt.model.n_embd:
        return f"model shape mismatch: upstream n_layer={hello.n_layer} n_embd={hello.n_embd}"
    if hello.layer_end != rt.layers[0]:
        return (f"upstream ends at layer {hello.layer_end}, this stage starts at {rt.layers[0]}: "
                "the stages' layer ranges must meet")
    return None


def _peer(stream: FrameStream) -> str:
    return peer_address(stream.stream)


async def serve_stage(runtime: StageRuntime, host: str, port: int, next_addr: tuple[str, int] | None = None, *,
                      on_session_end: Any = None, secret: bytes | None = None, tls: ssl.SSLContext | None = None,
                      next_tls: LinkTLS | None = None,
                      task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `runtime` on host:port until cancelled; `task_status` gets the bound port. With `secret`,
    upstream must prove it (and the next stage too) before anything else happens (see _auth).
    With `tls` (a server context, _tls.server_context) the link is TLS; `next_tls` reaches the
    next stage over TLS (see _tls)."""
    server = StageServer(runtime, next_addr, on_session_end=on_session_end, secret=secret, next_tls=next_tls)
    listeners: list[Any]
    if tls is None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
    else:
        listeners = await trio.open_ssl_over_tcp_listeners(port, tls, host=host)
        bound = listeners[0].transport_listener.socket.getsockname()[1]
    logger.info("stage {} listening on {}:{}{}{}", runtime.layers, host, bound, " (TLS)" if tls else "",
                f", next {next_addr[0]}:{next_addr[1]}" if next_addr else " (last stage)")
    task_status.started(bound)
    await trio.serve_listeners(server.handle, listeners)
