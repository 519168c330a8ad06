"""Hypothesis fuzzes the HTTP surface of a live server (the app and hypercorn with its limits,
over the real engine on a FakeRuntime): every route, hostile bodies, content types and headers.
Every answer is 2xx or 4xx with OpenAI's error body, nothing is logged at ERROR, and a correct
request is still answered correctly afterwards. Bounded here; `python -m stress.fuzz_http` runs
the same for 10k+ requests (stress/results/fuzz-http.md). The strategies and the judge live in
stress/fuzz_http.py."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
import trio

from stress.fuzz_http import HttpRequest, correct_request_works, fuzz, fuzz_server

pytestmark = pytest.mark.server

EXAMPLES = 800


def _raise(req: HttpRequest, problem: str) -> None:
    raise AssertionError(f"{problem}\n  request: {req.short()}")


async def test_fuzzed_requests_get_2xx_or_4xx_and_the_server_serves_on():
    with trio.fail_after(120):
        async with fuzz_server() as served:
            # hypothesis runs (and shrinks a failure) in a worker thread; the server runs here
            await trio.to_thread.run_sync(partial(fuzz, served.url, EXAMPLES, on_problem=_raise),
                                          abandon_on_cancel=True)
            with httpx.Client(base_url=served.url, timeout=10) as client:
                assert await trio.to_thread.run_sync(correct_request_works, client, served.runtime) is None
            await served.engine.settled()
            stats = served.engine.stats()
            assert stats.running == 0 and stats.waiting == 0 and stats.finished["error"] == 0
            assert served.errors == []
