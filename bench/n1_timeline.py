"""Where an N=1 token's wall time goes between two decodes, in-process (no HTTP), modes interleaved.

    python bench/n1_timeline.py [--modes plain burn200 switch50 pin] [--rounds 8] [--max-tokens 96] [--out DIR]

One engine (SmolLM2, 2 threads, `--no-batch-invariant` unless --inv), greedy, 128-token random
prompts. Each round streams one request per mode, the order rotated each round. The worker thread's
side is timed by wrapping two of skippy's functions from outside (nothing in skippy changes):
`runtime.decode_then_sample`'s decode call (start, end) and `Worker._finished` (the worker's
wake-up write: the step's result is ready). Per token, medians over the steady part of each request:
- **decode**: llama_decode's wall time;
- **worker**: decode end -> wake-up write (sampling, pieces, ledger, the result);
- **to next decode**: wake-up write -> the next decode's start. The next decode is already queued
  (chained), so this is the time the worker waits for a core and the GIL while the event loop runs
  its per-token burst (routing, delivery, the next step's bookkeeping);
- **TPOT** as the consumer sees it.

Modes:
- `plain`: as `skippy serve` runs it;
- `pin`: the event-loop thread pinned to the last CPU for that request (the worker and ggml's threads
  keep every CPU): a diagnostic. If "to next decode" collapses, the wait was for a core (the loop's
  burst, woken on the worker's core, preempting it), not for work;
- `burnN`: the consumer spins N us of Python per token: what N us more of event-loop work per token
  costs;
- `switchN`: the interpreter's switch interval at N us for that request (default 5000): if the
  worker waited for the GIL, a short interval would hand it over sooner.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import skippy  # noqa: E402
import skippy.runtime as runtime  # noqa: E402
from skippy.actors.worker import Worker  # noqa: E402

TRACE: list[tuple[str, float, float]] = []


def _instrument() -> None:
    original = runtime.decode_then_sample

    def decode_then_sample(decode, *args, **kwargs):
        def timed(*a):
            t0 = time.perf_counter()
            out = decode(*a)
            TRACE.append(("decode", t0, time.perf_counter()))
            return out
        return original(timed, *args, **kwargs)

    runtime.decode_then_sample = decode_then_sample
    finished = Worker._finished

    def _finished(self) -> None:
        TRACE.append(("wake", time.perf_counter(), 0.0))
        finished(self)

    Worker._finished = _finished


def _burn(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def breakdown(trace: list[tuple[str, float, float]], recv: list[float], skip: int = 8) -> dict[str, float]:
    """Median per-token figures of one request from its trace (decodes in order) and receive times."""
    decodes = [(a, b) for k, a, b in trace if k == "decode"]
    wakes = [a for k, a, _ in trace if k == "wake"]
    work, wait = [], []
    for (s0, e0), (s1, _) in zip(decodes[skip:-1], decodes[skip + 1:]):
        j = bisect.bisect_left(wakes, e0)
        if j < len(wakes) and wakes[j] < s1:
            work.append(wakes[j] - e0)
            wait.append(s1 - wakes[j])
    steady = decodes[skip:]
    return {
        "decode_ms": 1e3 * float(np.median([e - s for s, e in steady])),
        "worker_us": 1e6 * float(np.median(work)) if work else float("nan"),
        "to_next_decode_us": 1e6 * float(np.median(wait)) if wait else float("nan"),
        "tpot_ms": 1e3 * (recv[-1] - recv[skip]) / (len(recv) - 1 - skip),
    }


async def one(engine, prompt: list[int], max_tokens: int, mode: str) -> dict[str, float]:
    burn = float(mode[4:]) if mode.startswith("burn") else 0.0
    allowed = os.sched_getaffinity(0)
    interval = sys.getswitchinterval()
    if mode == "pin":
        os.sched_setaffinity(0, {max(allowed)})
    if mode.startswith("switch"):
        sys.setswitchinterval(float(mode[6:]) * 1e-6)
    TRACE.clear()
    recv: list[float] = []
    try:
        async for e in engine.generate(prompt, max_tokens=max_tokens, ignore_eos=True):
            if e.token is not None:
                recv.append(time.perf_counter())
                if burn:
                    _burn(burn)
    finally:
        os.sched_setaffinity(0, allowed)
        sys.setswitchinterval(interval)
    return breakdown(list(TRACE), recv)


async def run(a: argparse.Namespace) -> dict:
    _instrument()
    rng = np.random.default_rng(a.seed)
    per: dict[str, list[dict[str, float]]] = {m: [] for m in a.modes}
    async with skippy.open_engine(a.model, n_ctx=a.n_ctx, threads=a.threads, batch_invariant=a.inv) as engine:
        await one(engine, rng.integers(1000, 20000, size=128).tolist(), 32, "plain")  # warm-up
        for r in range(a.rounds):
            prompt = rng.integers(1000, 20000, size=128).tolist()
            for mode in a.modes[r % len(a.modes):] + a.modes[: r % len(a.modes)]:
                per[mode].append(await one(engine, prompt, a.max_tokens, mode))
    return {m: {k: round(float(np.median([x[k] for x in xs])), 3) for k in xs[0]} | {"requests": len(xs)}
            for m, xs in per.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", nargs="+", default=["plain", "burn200", "switch50", "pin"])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--inv", action="store_true", help="the batch-invariant kernels (skippy's default)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    for m in a.modes:
        if m not in ("plain", "pin") and not any(m.startswith(k) and m[len(k):].replace(".", "", 1).isdigit()
                                                  for k in ("burn", "switch")):
            p.error(f"unknown mode {m!r}: plain, pin, burnN or switchN")
    result = trio.run(run, a)
    command = "python bench/n1_timeline.py " + " ".join(sys.argv[1:])
    lines = [f"# N=1 between two decodes, in-process, modes interleaved ({a.rounds} rounds x {a.max_tokens} tokens)",
             "", f"    {command}", "",
             "| mode | decode ms | worker: decode end -> result us | result -> next decode us | TPOT ms |",
             "|---|---|---|---|---|"]
    lines += [f"| {m} | {r['decode_ms']:.3f} | {r['worker_us']:.0f} | {r['to_next_decode_us']:.0f} | {r['tpot_ms']:.3f} |"
              for m, r in result.items()]
    print("\n".join(lines))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "timeline.json").write_text(json.dumps({"command": command, "modes": result}, indent=1) + "\n")
        (out / "timeline.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
