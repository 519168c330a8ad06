"""skippy.actors.worker: jobs run in order on one thread, a waiter wakes when its own job is done
(not on another job's wake-up), a cancelled waiter aborts and still waits, and close joins."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from skippy.actors.worker import Worker


@pytest.fixture
def worker():
    w = Worker(name="test-worker")
    yield w
    if w.alive:
        w.close()


async def test_jobs_run_in_order_on_the_worker_thread(worker):
    seen: list[tuple[int, str]] = []
    with trio.fail_after(10):
        jobs = [worker.start(lambda i=i: seen.append((i, threading.current_thread().name)) or i) for i in range(20)]
        assert [await j.result() for j in jobs] == list(range(20))
    assert seen == [(i, "test-worker") for i in range(20)]


async def test_a_waiter_wakes_only_for_its_own_job(worker):
    gate = threading.Event()
    with trio.fail_after(10):
        first = worker.start(lambda: "first")
        second = worker.start(lambda: gate.wait(10) and "second")
        assert await first.result() == "first"
        async with trio.open_nursery() as nursery:
            got = []

            async def collect() -> None:
                got.append(await second.result())

            nursery.start_soon(collect)
            await trio.sleep(0.05)  # a stale wake-up from `first` may be read meanwhile
            assert got == [] and not second.done
            gate.set()
        assert got == ["second"]


async def test_an_exception_comes_back_to_the_waiter(worker):
    def boom() -> None:
        raise ValueError("from the worker")

    with trio.fail_after(10):
        with pytest.raises(ValueError, match="from the worker"):
            await worker.start(boom).result()
        assert await worker.start(lambda: 7).result() == 7  # the thread goes on


async def test_a_cancelled_waiter_aborts_the_job_and_still_waits_for_it(worker):
    stop = threading.Event()
    aborted: list[bool] = []

    def long_job() -> str:
        stop.wait(10)
        time.sleep(0.05)  # still running a moment after the abort
        return "done"

    def abort() -> None:
        aborted.append(True)
        stop.set()

    with trio.fail_after(10):
        job = worker.start(long_job)
        with trio.move_on_after(0.05) as scope:
            await job.result(on_cancel=abort)
    assert scope.cancelled_caught and aborted == [True]
    assert job.done  # the waiter left only once the job had finished


async def test_wake_ups_nobody_reads_never_block_the_worker(worker):
    """A job found done without a wait leaves its wake-up in the pipe unread. More of them than
    the pipe holds (64 KiB on Linux) must not block the thread that finishes jobs, and a waiter
    still wakes after them."""
    wrote = threading.Event()

    def finish_many() -> None:
        for _ in range(70_000):
            worker._finished()
        wrote.set()

    t = threading.Thread(target=finish_many, daemon=True)
    t.start()
    t.join(10)
    assert wrote.is_set(), "a wake-up into a full pipe blocked"
    with trio.fail_after(10):
        assert await worker.start(lambda: "after").result() == "after"


def test_close_joins_the_thread():
    w = Worker()
    w.close()
    assert not w.alive
