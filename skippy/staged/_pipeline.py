"""Stage 0: the request API, tokenization, admission and the first layers, over the usual engine.

The engine's actors are unchanged; its RuntimeOwner drives a PipelineRuntime whose step runs
the local layers micro-batch by micro-batch and hands each down the link as soon as it is
computed, so the stages below work on part 1 while stage 0 computes part 2. The last stage
samples (with the uniform draw stage 0's per-request RNG made, so tokens equal one process's)
and the tokens come back up the same connections.

The link is a session over the whole chain: when any stage goes, the session ends, the steps
waiting on it fail with StageUnavailableError (no hang), and the next step connects afresh;
requests whose state below stage 0 died with the old session fail once, clearly.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from contextlib import AsyncExitStack
from typing import Any, AsyncIterator, Iterator, Sequence

import attrs
import numpy as np
import trio
from loguru import logger

from ..errors import (
    DecodeAbortedError, InvalidInputError, NoKvSlotError, StageFailedError, StageUnavailableError,
)
from ..kv import Ledger
from ..native import Model
from ..runtime import ContextRuntime, Sampled, file_digest
from ..sampling import Sampler
from ._auth import say_hello
from ._frames import Activations, Error, FrameError, Hello, Message, Open, Release, StepEnd, Token
from ._microbatch import SESSION_ENDING, split_step
from ._tls import LinkTLS
from ._transport import FrameStream, StageDisconnected, connect

WIRE_DTYPES = {"f32": np.float32, "f16": np.float16}


@attrs.frozen
class PipelineInfo:
    """What stage 0 learnt from the chain's Hello: the ceiling is derived, not configured."""

    n_stages: int
    layers: tuple[int, int]  # stage 0's own
    n_layer: int
    lanes_below: int  # the fewest sessions any later stage holds
    cells_below: int
    micro_batches: int


class _Answer:
    def __init__(self) -> None:
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.tokens: list[Token] = []


class _LinkSession:
    """One connection down the chain (stage 0's end of a session); frames go out in submission order from one task."""

    def __init__(self, stream: FrameStream, hello: Hello, epoch: int, where: str) -> None:
        self.stream, self.hello, self.epoch, self.where = stream, hello, epoch, where
        self.alive = True
        self.pending: deque[_Answer] = deque()
        self.outbox_tx, self.outbox_rx = trio.open_memory_channel(math.inf)
        self.scope = trio.CancelScope()

    async def run(self) -> None:
        with self.scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send)
                    await self._receive()
                    nursery.cancel_scope.cancel()
            # except*: the nursery wraps a task's error in a group (a reset from a killed stage is one)
            except* (StageDisconnected, FrameError, trio.BrokenResourceError, trio.ClosedResourceError) as group:
                self.fail(StageUnavailableError(f"the pipeline below stage 0 ({self.where}) is gone: "
                                                f"{group.exceptions[0]}"))
        self.fail(StageUnavailableError(f"the pipeline below stage 0 ({self.where}) closed the connection"))
        with trio.CancelScope(shield=True):
            await self.stream.aclose()

    async def _send(self) -> None:
        async for frame in self.outbox_rx:
            await self.stream.send(frame)

    async def _receive(self) -> None:
        while True:
            msg = await self.stream.receive()
            if msg is None:
                return
            if isinstance(msg, Error) and msg.code in SESSION_ENDING:
                self.fail(StageUnavailableError(f"{msg.code}: {msg.message}"))
                return
            if not self.pending:
                self.fail(StageUnavailableError(f"an answer for no micro-batch came up: {type(msg).__name__}"))
                return
            if isinstance(msg, Token):
                self.pending[0].tokens.append(msg)
            elif isinstance(msg, StepEnd):
                answer = self.pending.popleft()
                answer.future.set_result(answer.tokens)
            elif isinstance(msg, Error):
                error = NoKvSlotError(1, msg.message) if msg.code == "no_kv_slot" else StageFailedError(msg.code, msg.message)
                self.pending.popleft().future.set_exception(error)
            else:
                self.fail(StageUnavailableError(f"unexpected {type(msg).__name__} from below"))
                return

    def submit(self, frames: Sequence[Message], answered: bool) -> _Answer | None:
        if not self.alive:
            raise StageUnavailableError(f"the pipeline below stage 0 ({self.where}) is gone")
        answer = _Answer() if answered else None
        if answer is not None:
            self.pending.append(answer)
        for frame in frames:
            self.outbox_tx.send_nowait(frame)
        return answer

    def fail(self, error: Exception) -> None:
        if self.alive:
            logger.warning("pipeline session {} ended: {}", self.epoch, error)
        self.alive = False
        while self.pending:
            self.pending.popleft().future.set_exception(error)
        self.scope.cancel()


class PipelineLink:
    """Stage 0's end of the chain: one session at a time, connected on demand."""

    def __init__(self, next_addr: tuple[str, int], hello: Hello, *, connect_timeout: float = 10.0,
                 secret: bytes | None = None, tls: LinkTLS | None = None) -> None:
        self.next_addr, self.hello, self.connect_timeout = next_addr, hello, connect_timeout
        self.secret = secret  # the stage secret: proven to stage 1, and stage 1 must prove it (see _auth)
        self.tls = tls  # stage 1 over TLS, its certificate checked (see _tls)
        self.session: _LinkSession | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._epochs = itertools.count(1)
        self._connecting = trio.Lock()
        self.required = (1, 1)  # (lanes, cells) the engine was sized for: a returning stage must hold them

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def probe(self) -> Hello:
        """What the chain holds (lanes, cells), from a Hello on a connection closed at once."""
        stream, reply = await self._connect()
        await stream.aclose()  # gracefully: over TLS a forceful close reads as a broken link below
        return reply

    async def _connect(self) -> tuple[FrameStream, Hello]:
        host, port = self.next_addr
        where = f"{host}:{port}"
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await connect(host, port, tls=self.tls)
                try:
                    reply = await say_hello(stream, self.hello, self.secret, where)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except (OSError, StageDisconnected, FrameError, trio.TooSlowError) as exc:
            raise StageUnavailableError(f"stage 1 at {where} is unreachable: {exc!r}") from None
        problem = _check_reply(reply, self.hello, self.required)
        if problem:
            await trio.aclose_forcefully(stream)
            raise StageUnavailableError(f"stage 1 at {where}: {problem}")
        return stream, reply

    async def ensure(self) -> _LinkSession:
        """The live session, connecting (and saying Hello) when there is none."""
        async with self._connecting:
            if self.session is not None and self.session.alive:
                return self.session
            stream, reply = await self._connect()
            assert self._nursery is not None
            self.session = _LinkSession(stream, reply, next(self._epochs), "{}:{}".format(*self.next_addr))
            self._nursery.start_soon(self.session.run)
            logger.info("pipeline session {}: {} stages, layers [{}, {}) below stage 0 hold {} sessions, {} cells",
                        self.session.epoch, reply.n_stages, reply.layer_begin, reply.layer_end, reply.lanes, reply.cells)
            return self.session


def _check_reply(reply: Message | None, hello: Hello, required: tuple[int, int]) -> str | None:
    if isinstance(reply, Error):
        return f"{reply.code}: {reply.message}"
    if reply is None:
        return "closed the connection at Hello (a TLS stage refuses plaintext: reach it with tls= / --tls-ca)"
    if not isinstance(reply, Hello):
        return f"answered {type(reply).__name__} to Hello"
    if reply.model_digest != hello.model_digest or reply.n_embd != hello.n_embd:
        return "runs another model"
    if reply.layer_begin != hello.layer_end or reply.layer_end != hello.n_layer:
        return (f"the stages below cover layers [{reply.layer_begin}, {reply.layer_end}), stage 0 needs "
                f"[{hello.layer_end}, {hello.n_layer})")
    lanes, cells = required
    if reply.lanes < max(1, lanes) or reply.cells < max(1, cells):
        return (f"the stages below hold {reply.lanes} sessions and {reply.cells} cells; stage 0 was sized for "
                f"{lanes} and {cells} (restart stage 0 after resizing a stage)")
    return None


class PipelineRuntime:
    """The Runtime the engine's RuntimeOwner drives at stage 0 (see skippy.runtime.Runtime).

    Called on the engine's worker thread (decode_sample, rollback) and on the trio thread
    (releases); the link lives on the trio thread, so both reach it through `_on_trio`."""

    prefix_identity = None  # the prefix cache would need seq_cp in every stage: off (see the issue note)
    share_exact = False

    def __init__(self, local: ContextRuntime, link: PipelineLink, *, micro_batches: int, wire_dtype: str = "f32",
                 answer_timeout: float = 300.0, ids: Iterator[int] | None = None,
                 steps: Iterator[int] | None = None) -> None:
        if wire_dtype not in WIRE_DTYPES:
            raise InvalidInputError(f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
        self.local, self.link = local, link
        self.model = local.model
        self.arch, self.n_ctx, self.n_batch, self.n_seq_max = local.arch, local.n_ctx, local.n_batch, local.n_seq_max
        self.n_vocab = local.n_vocab
        self.micro_batches = max(1, micro_batches)
        self.wire_dtype = WIRE_DTYPES[wire_dtype]
        self.answer_timeout = answer_timeout
        # request id 0 means "no request" in Error frames; groups over one link share the counters
        self._ids = ids if ids is not None else itertools.count(1)
        self._held: dict[int, tuple[int, int]] = {}  # seq -> (request id, session epoch)
        self._chunks: dict[int, int] = {}
        self._steps = steps if steps is not None else itertools.count()
        self._aborted = threading.Event()
        # where stage 0's step time went: its own layers, or waiting for the stages below
        self.compute_s = 0.0
        self.wait_s = 0.0

    # -- the step ------------------------------------------------------------------

    def decode_sample(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                      samplers: Sequence[Sampler]) -> Sampled:
        """One step through every stage: a token per output row, sampled by the last stage.
        Its t_decode is the whole step's wall time, until the last micro-batch's tokens came up."""
        t0 = time.perf_counter()
        self._aborted.clear()
        session = self.link.session  # read on this thread; only a dead or missing one needs the trio thread
        if session is None or not session.alive:
            session = self._on_trio_async(self.link.ensure)
        stale = sorted({int(s) for s in np.unique(seq_ids) if int(s) in self._held
                        and self._held[int(s)][1] != session.epoch})
        if stale:
            raise StageUnavailableError(f"sequences {stale}: their state below stage 0 was lost when the pipeline's "
                                        "session ended; they cannot continue")
        states = [s.state() for s in samplers]
        try:
            out = self._step(session, tokens, positions, seq_ids, outputs, samplers)
        except BaseException:
            for sampler, state in zip(samplers, states):  # a failed step draws nothing, as in one process
                sampler.restore(state)
            raise
        return Sampled(out, time.perf_counter() - t0)

    def _step(self, session: _LinkSession, tokens, positions, seq_ids, outputs, samplers) -> np.ndarray:
        draws = iter([(s.params, s.draw()) for s in samplers])
        opens = []
        for s in dict.fromkeys(int(x) for x in seq_ids):
            if s not in self._held:
                rid = next(self._ids)
                self._held[s] = (rid, session.epoch)
                self._chunks[rid] = 0
                opens.append(Open(rid, {"seq": s}))
        if opens:
            self._on_trio(session.submit, opens, False)
        answers: list[tuple[_Answer, list[int]]] = []
        for part in split_step(seq_ids, outputs, self.micro_batches):
            rows = np.concatenate([np.arange(seg.start, seg.stop) for seg in part])
            t0 = time.perf_counter()
            # every row is an output of a stage before the last (its hidden state goes down)
            hidden = self.local.decode(tokens[rows], positions[rows], seq_ids[rows], np.ones(len(rows), bool))
            frames: list[Message] = []
            sampled: list[int] = []
            row = 0
            for seg in part:
                rid = self._held[seg.seq][0]
                sampling = None
                if seg.output:
                    params, u = next(draws)
                    if u is not None:
                        sampling = (float(params.temperature), int(params.top_k), float(params.top_p),
                                    float(params.min_p), u)
                    sampled.append(rid)
                frames.append(Activations(rid, self._chunk(rid), positions[seg.start:seg.stop].astype(np.int32),
                                          hidden[row:row + seg.n_tokens].astype(self.wire_dtype), seg.output, sampling))
                row += seg.n_tokens
            frames.append(StepEnd(next(self._steps), len(frames)))
            self.compute_s += time.perf_counter() - t0
            answers.append((self._on_trio(session.submit, frames, True), sampled))
        out: list[int] = []
        t0 = time.perf_counter()
        for answer, sampled in answers:
            try:
                got = self._wait(answer)
            finally:
                self.wait_s += time.perf_counter() - t0
                t0 = time.perf_counter()
            if [t.request_id for t in got] != sampled:
                raise StageFailedError("bad_answer", f"tokens for requests {[t.request_id for t in got]}, "
                                                     f"expected {sampled}")
            out += [t.token for t in got]
        return np.array(out, dtype=np.int64)

    def _chunk(self, rid: int) -> int:
        n = self._chunks[rid]
        self._chunks[rid] = n + 1
        return n

    def _wait(self, answer: _Answer) -> list[Token]:
        waited = 0.0
        while True:
            if self._aborted.is_set():
                raise DecodeAbortedError(2, "the step was aborted while the stages below computed")
            try:
                return answer.future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                waited += 0.05
                if waited > self.answer_timeout:
                    raise StageUnavailableError(f"no answer from the stages below in {self.answer_timeout} s") from None

    # -- memory ----------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Local removal; below stage 0 only whole sequences go (a Release). A partial removal
        of a sequence held below answers False, so the caller removes it whole."""
        ok = self.local.seq_rm(seq_id, p0, p1)
        held = self._held.get(seq_id)
        if held is None:
            return ok
        if p0 > 0 or p1 >= 0:
            return False
        rid, epoch = self._held.pop(seq_id)
        self._chunks.pop(rid, None)
        session = self.link.session
        if session is not None and session.alive and session.epoch == epoch:
            try:
                self._on_trio(session.submit, [Release(rid, "released")], False)
            except StageUnavailableError:
                pass
        return ok

    def share(self, src: int, dst: int, length: int) -> int:
        return 0

    def ledger(self) -> Ledger:
        return self.local.ledger()

    def abort(self) -> None:
        self._aborted.set()
        self.local.abort()

    def tokenize(self, text: str, add_special: bool = True) -> np.ndarray:
        return self.local.tokenize(text, add_special)

    def piece(self, token: int) -> bytes:
        return self.local.piece(token)

    def is_eog(self, token: int) -> bool:
        return self.local.is_eog(token)

    def close(self) -> None:
        self.local.close()

    # -- reaching the trio thread -------------------------------------------------------

    def _on_trio(self, fn: Any, *args: Any) -> Any:
        if _in_trio():
            return fn(*args)
        return trio.from_thread.run_sync(fn, *args, trio_token=self.link.token)

    def _on_trio_async(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self.link.token)


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidInputError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


@asynccontextmanager
async def open_pipeline(model: Any, layer_end: int, next_addr: tuple[str, int], *, micro_batches: int | None = None,
                        wire_dtype: str = "f32", connect_timeout: float = 10.0, groups: int = 1,
                        secret: bytes | None = None, tls: LinkTLS | None = None, **config: Any) -> AsyncIterator[Any]:
    """An Engine whose stage 0 holds layers [0, layer_end) and whose later stages listen from
    `next_addr` on. Lanes and cells are the fewest any stage holds, learnt from the chain.
    With `secret` (the stages' shared secret, see skippy.staged._auth) stage 0 proves it to
    stage 1 and refuses a stage 1 that cannot prove it back. With `tls` (skippy.staged._tls.client_tls)
    stage 1 is reached over TLS and must present a certificate from that CA, for its name.

    `groups` > 1 splits the sessions, lanes and stage-0 cells across that many engines over
    the same link (see skippy.staged._groups): their steps interleave in the pipeline."""
    from ..engine import EngineConfig, open_engine_on, plan_engine
    from ..models import resolve_model
    from ..native import ensure_built
    from ._groups import PipelineEngine

    if config.get("prefix_cache"):
        raise InvalidInputError("the prefix cache is not carried down a pipeline: leave prefix_cache off")
    if not isinstance(groups, int) or groups < 1:
        raise InvalidInputError(f"groups must be an integer >= 1, got {groups!r}")
    if wire_dtype not in WIRE_DTYPES:  # before anything is loaded
        raise InvalidInputError(f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
    config = {**config, "prefix_cache": False}
    cfg = EngineConfig(**config)
    ensure_built(progress=False)
    path = resolve_model(model) if model is None or isinstance(model, (str, os.PathLike)) else model
    local_model = Model(path, repack=not cfg.batch_invariant, layers=(0, layer_end))
    locals_: list[ContextRuntime] = []
    try:
        if not local_model.returns_hidden:
            raise InvalidInputError(f"stage 0 with layers [0, {layer_end}) is the whole model: nothing to hand down")
        hello = Hello(0, 1, 0, layer_end, local_model.n_layer, local_model.n_embd, file_digest(path))
        link = PipelineLink(next_addr, hello, connect_timeout=connect_timeout, secret=secret, tls=tls)
        below = await link.probe()  # before any nursery: a refusal raises as itself
        lanes = min(cfg.n_seq_max or below.lanes, below.lanes)
        if lanes < groups:
            raise InvalidInputError(f"{groups} groups need at least {groups} lanes; the pipeline holds {lanes}")
        # sized as the engine sizes itself (n_ctx, memory_bytes, n_seq_max), then capped by what the
        # stages below hold; each group gets 1/groups of it all
        plan, options = plan_engine(local_model, cfg, measure=False, cells_cap=below.cells, lanes_cap=below.lanes,
                                    split=groups)
        for _ in range(groups):
            locals_.append(ContextRuntime(local_model, options))
    except BaseException:
        for local in locals_:
            local.close()
        local_model.close()
        raise
    link.required = (plan.ceiling * groups, plan.n_ctx * groups)
    ids, steps = itertools.count(1), itertools.count()
    runtimes = [PipelineRuntime(local, link, micro_batches=micro_batches or below.n_stages, wire_dtype=wire_dtype,
                                ids=ids, steps=steps) for local in locals_]
    info = PipelineInfo(below.n_stages, (0, layer_end), local_model.n_layer, below.lanes, below.cells,
                        runtimes[0].micro_batches)
    logger.info("pipeline: stage 0 holds layers [0, {}), {} stages, {} group(s) of ceiling {} ({} below), n_ctx {}",
                layer_end, info.n_stages, groups, plan.ceiling, below.lanes, plan.n_ctx)
    engines: list[Any] = []
    try:
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            await nursery.start(link.run)
            try:
                for runtime in runtimes:  # each engine closes its runtime (and so its context)
                    engines.append(await stack.enter_async_context(
                        open_engine_on(runtime, plan, pipeline=info, **{**config, "n_seq_max": plan.ceiling})))
                yield engines[0] if groups == 1 else PipelineEngine(engines, info)
            finally:
                nursery.cancel_scope.cancel()
    finally:
        for runtime in runtimes[len(engines):]:  # never reached an engine (one failed to open)
            runtime.close()
        local_model.close()
