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
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome] = []

        def job() -> None:
            box.append(outcome.capture(fn))
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        self._jobs.put(job)
        try:
            await done.wait()
        except trio.Cancelled:
            if on_cancel is not None:
                on_cancel()
            with trio.CancelScope(shield=True):
                await done.wait()
            raise
        return box[0].unwrap()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
