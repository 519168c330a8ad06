"""One N=1 request's worker jobs on a time line: is the next decode queued before the worker is free?

    python bench/n1_job_trace.py [--tokens 40] [--out DIR]

In-process, SmolLM2, the default kernels. Besides bench/n1_timeline.py's two wrappers (the decode
call, the worker's wake-up write) it wraps, from outside, `Worker.start` (a job queued), `Job.__call__`
(the worker takes it) and `RuntimeOwner.ask` (the composer's Launch and Collect, with the ticket a
Collect waits for). Prints the events around the 20th decode, in ms from its start: a chained
decode's job is `put` during the decode before it, so any time between that decode's `wake` and
the `got` of the next job is the worker waiting for the event loop, not for work.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import n1_timeline as T  # noqa: E402
from skippy.actors import runtime_owner as RO  # noqa: E402
from skippy.actors import worker as W  # noqa: E402


def _instrument_jobs() -> None:
    log, start, call, ask = T.TRACE, W.Worker.start, W.Job.__call__, RO.RuntimeOwner.ask

    def traced_start(self, fn):
        job = start(self, fn)
        log.append((f"put job {id(job) % 10000}", time.perf_counter(), 0.0))
        return job

    def traced_call(self):
        log.append((f"got job {id(self) % 10000}", time.perf_counter(), 0.0))
        return call(self)

    async def traced_ask(self, what):
        name = type(what).__name__
        extra = f" (waits for job {id(what.ticket) % 10000})" if name == "Collect" else ""
        log.append((f"{name} asked{extra}", time.perf_counter(), 0.0))
        answer = await ask(self, what)
        log.append((f"{name} answered", time.perf_counter(), 0.0))
        return answer

    W.Worker.start, W.Job.__call__, RO.RuntimeOwner.ask = traced_start, traced_call, traced_ask


async def run(tokens: int) -> list[str]:
    import skippy

    T._instrument()
    _instrument_jobs()
    rng = np.random.default_rng(1)
    async with skippy.open_engine("smollm2", n_ctx=16384, threads=2, batch_invariant=False) as engine:
        await T.one(engine, rng.integers(1000, 20000, size=128).tolist(), 16, "plain")  # warm-up
        T.TRACE.clear()
        async for e in engine.generate(rng.integers(1000, 20000, size=128).tolist(), max_tokens=tokens,
                                       ignore_eos=True):
            if e.token is not None:
                T.TRACE.append(("token received", time.perf_counter(), 0.0))
    events = sorted(T.TRACE, key=lambda e: e[1])
    t0 = [e for e in events if e[0] == "decode"][20][1]
    return [f"{1e3 * (a - t0):8.3f}  {k}" + (f" (ends {1e3 * (b - t0):.3f})" if k == "decode" else "")
            for k, a, b in events if t0 - 0.0012 <= a <= t0 + 0.015]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    lines = trio.run(run, a.tokens)
    command = "python bench/n1_job_trace.py " + " ".join(sys.argv[1:])
    text = "\n".join([f"    {command}", "", "    ms from the 20th decode's start", *(f"    {x}" for x in lines)]) + "\n"
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "job-trace.md").write_text("# One N=1 request's worker jobs\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
