"""One dedicated OS thread for llama calls that take long (decode).

Not trio's thread cache: the engine starts this thread and joins it at shutdown,
so nothing is left behind. A cancelled caller aborts the running job and still
waits for it, because the context it uses must not be touched concurrently.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import outcome
import trio


class Job:
    """One queued call on the worker thread; `result()` waits for it (cancelling it aborts and waits)."""

    def __init__(self, fn: Callable[[], Any], token: trio.lowlevel.TrioToken) -> None:
        self._fn, self._token = fn, token
        self._done = trio.Event()
        self._outcome: outcome.Outcome | None = None

    def __call__(self) -> None:  # on the worker thread
        self._outcome = outcome.capture(self._fn)
        try:
            self._token.run_sync_soon(self._done.set)
        except trio.RunFinishedError:
            pass

    async def result(self, on_cancel: Callable[[], None] | None = None) -> Any:
        try:
            await self._done.wait()
        except trio.Cancelled:
            if on_cancel is not None:
                on_cancel()
            with trio.CancelScope(shield=True):
                await self._done.wait()
            raise
        assert self._outcome is not None
        return self._outcome.unwrap()


class Worker:
    def __init__(self, name: str = "skippy-runtime") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    async def run(self, fn: Callable[[], Any], on_cancel: Callable[[], None] | None = None) -> Any:
        return await self.start(fn).result(on_cancel)

    def start(self, fn: Callable[[], Any]) -> "Job":
        """Queue `fn` and return at once; jobs run one after another, in the order started, so a
        second job queued behind a running one starts the moment the first is done."""
        job = Job(fn, trio.lowlevel.current_trio_token())
        self._jobs.put(job)
        return job

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
