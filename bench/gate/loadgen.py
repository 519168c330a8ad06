"""Arrival processes, independent of what a request is: closed loop and open-loop Poisson.

Closed loop: N workers share one counter of request indices; each sends its next request
when its last one finishes (the clean scaling curve). Open loop: requests leave at seeded
Poisson times whatever the server is doing (what a service sees), each in its own task.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import numpy as np
import trio

from .records import RequestRecord

Send = Callable[[int], Awaitable[RequestRecord]]


async def closed_loop(n: int, count: int, send: Send) -> list[RequestRecord]:
    """`count` requests through `n` workers; records in index order."""
    records: list[RequestRecord] = []
    indices = iter(range(count))  # shared: each index is taken by exactly one worker

    async def worker() -> None:
        for i in indices:
            records.append(await send(i))

    async with trio.open_nursery() as nursery:
        for _ in range(min(n, count)):
            nursery.start_soon(worker)
    return sorted(records, key=lambda r: r.index)


def poisson_offsets(rate: float, count: int, seed: int) -> list[float]:
    """Send times in seconds from the start: the first at 0, then exponential gaps of mean 1/rate."""
    if rate <= 0:
        raise ValueError("the arrival rate must be positive")
    gaps = np.random.default_rng([seed, count]).exponential(1 / rate, size=max(count - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:count]


async def open_loop(offsets: list[float], send: Send) -> list[RequestRecord]:
    """One request at each offset (seconds from now), never waiting for earlier ones."""
    records: list[RequestRecord] = []

    async def one(i: int) -> None:
        records.append(await send(i))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i, offset in enumerate(offsets):
            await trio.sleep_until(start + offset)
            nursery.start_soon(one, i)
    return sorted(records, key=lambda r: r.index)
