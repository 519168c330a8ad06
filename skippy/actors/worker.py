"""One dedicated OS thread for llama calls that take long (decode).

Not trio's thread cache: the engine starts this thread and joins it at shutdown,
so nothing is left behind. A cancelled caller aborts the running job and still
waits for it, because the context it uses must not be touched concurrently.

A finished job wakes its waiter through a pipe the event loop polls (`wait_readable`), not
`run_sync_soon`: that would run the wake-up in trio's entry-queue task, one more task step on
the event loop per decode step, whose CPU a 2-core box takes from ggml's compute threads
(bench/results/n1-lean-path). One task waits at a time (the runtime owner's lock serialises
every use of the thread); the pipe only says "something finished", the job says what.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable

import outcome
import trio


class Job:
    """One queued call on the worker thread; `result()` waits for it (cancelling it aborts and waits)."""

    def __init__(self, fn: Callable[[], Any], worker: "Worker") -> None:
        self._fn, self._worker = fn, worker
        self._outcome: outcome.Outcome | None = None

    def __call__(self) -> None:  # on the worker thread
        self._outcome = outcome.capture(self._fn)
        self._worker._finished()

    @property
    def done(self) -> bool:
        return self._outcome is not None

    async def result(self, on_cancel: Callable[[], None] | None = None) -> Any:
        try:
            await self._worker._wait(self)
        except trio.Cancelled:
            if on_cancel is not None:
                on_cancel()
            with trio.CancelScope(shield=True):
                await self._worker._wait(self)
            raise
        assert self._outcome is not None
        return self._outcome.unwrap()


class Worker:
    def __init__(self, name: str = "skippy-runtime") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # a full pipe already says "something finished": a write that would block is dropped, so
        # wake-ups nobody read (jobs found done without waiting) never stop the worker thread
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def _finished(self) -> None:  # on the worker thread, after a job's outcome is set
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full: a wake-up is pending already
            pass
        except OSError:  # closed under us at shutdown: nobody waits any more
            pass

    async def _wait(self, job: Job) -> None:
        """Until `job` is done; a checkpoint either way."""
        if job.done:
            await trio.lowlevel.checkpoint()
            return
        while not job.done:
            await trio.lowlevel.wait_readable(self._wake_r)
            try:
                os.read(self._wake_r, 4096)  # wake-ups of jobs already collected, too
            except BlockingIOError:
                pass

    def start(self, fn: Callable[[], Any]) -> "Job":
        """Queue `fn` and return at once; jobs run one after another, in the order started, so a
        second job queued behind a running one starts the moment the first is done."""
        job = Job(fn, self)
        self._jobs.put(job)
        return job

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
        try:
            trio.lowlevel.notify_closing(self._wake_r)  # a waiter, if any, gets ClosedResourceError
        except RuntimeError:  # closed outside trio.run: nobody can be waiting
            pass
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
