"""The worker thread's time outside llama_decode per token during a run ahead, in-process, N=1.

    python bench/run_ahead_step_cost.py [--inv] [--rounds 6] [--max-tokens 256] [--model smollm2]

One engine (SmolLM2, 2 threads, a 16384-cell pool; `--no-batch-invariant` unless --inv). Each round
streams one greedy request; after its first token the stream is diverted (GenerationStream.divert) to
a `take` that renders a small JSON chunk and writes it to a socketpair drained by a thread, so the
steps run ahead on the worker thread as under `skippy serve`, without an HTTP client competing for
the CPU. llama_decode is timed by a proxy of the context's cffi lib. Per round: wall per decode,
llama_decode per decode, and the rest (batch, checks, logits view, sampling, routing, the write,
the run's bookkeeping). Rounds after the first are summarised (median).
To compare two trees, run the other one with PYTHONSAFEPATH=1 PYTHONPATH=<tree> SKIPPY_CACHE=<its
cache>, alternating (bench/results/lean-step).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

import trio

import skippy


class TimedLib:
    """The context's cffi lib with llama_decode timed."""

    def __init__(self, lib) -> None:
        self._lib, self.seconds, self.calls = lib, 0.0, 0

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def llama_decode(self, *args):
        t0 = time.perf_counter()
        try:
            return self._lib.llama_decode(*args)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


async def main(a: argparse.Namespace) -> None:
    near, far = socket.socketpair()
    near.setblocking(False)
    threading.Thread(target=lambda: [None for _ in iter(lambda: far.recv(1 << 16), b"")], daemon=True).start()

    def take(event) -> bool:
        body = json.dumps({"choices": [{"delta": {"content": event.text}}]}).encode()
        near.send(b"data: " + body + b"\n\n")
        return True

    async with skippy.open_engine(a.model, n_ctx=a.n_ctx, threads=2, batch_invariant=a.inv) as engine:
        timed = TimedLib(engine.runtime.ctx._lib)
        engine.runtime.ctx._lib = timed
        prompt = list(range(100, 100 + a.prompt_len))
        rows = []
        for r in range(a.rounds):
            stream = engine.generate(prompt, max_tokens=a.max_tokens, ignore_eos=True)
            start = None
            async for _ in stream:
                if start is None:
                    start, d0, k0 = time.perf_counter(), timed.seconds, timed.calls
                    stream.divert(take)
            wall, dec, k = time.perf_counter() - start, timed.seconds - d0, timed.calls - k0
            rows.append((1e3 * wall / k, 1e3 * dec / k, 1e3 * (wall - dec) / k))
            print(f"round {r}: {k} decodes; ms per decode {rows[-1][0]:.3f}, in llama_decode {rows[-1][1]:.3f}, "
                  f"outside {rows[-1][2]:.3f}", flush=True)
        print(f"run-ahead steps {engine.stats().run_ahead_steps}")
        rest = rows[1:] or rows
        print(f"median: ms per decode {statistics.median(r[0] for r in rest):.3f}, "
              f"outside llama_decode {statistics.median(r[2] for r in rest):.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inv", action="store_true", help="batch-invariant kernels (skippy's default)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--model", default="smollm2", help="a model name or GGUF path (the test: a synthetic one)")
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--prompt-len", type=int, default=128)
    trio.run(main, p.parse_args())
