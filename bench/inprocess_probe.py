"""In-process probes behind figures in bench/results/{gate-matrix,token-latency-final}/README.md.

    python bench/inprocess_probe.py tpot  [--prefix 0|1] [--n-seq-max N] [--inv 0|1]   # N=1 TPOT, SmolLM2
    python bench/inprocess_probe.py ttft  [--inv 0|1]                                  # N=1 TTFT, SmolLM2
    python bench/inprocess_probe.py waves [--prefix 0|1] [--waves K] [--model PATH]    # N=8 TPOT per wave

Unique random prompts (128 tokens), as the gate's chat workload sends; ignore_eos fixes lengths.
`waves` runs K waves of 8 concurrent requests on a hybrid model: a TPOT that grows wave by wave
while the batch stays 8 is the cost of llama.cpp's recurrent copies over scattered state cells.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import trio

import skippy

FALCON = Path.home() / ".cache/skippy/models/synth/falcon-h1-base-q4_k_m-s0-v1.gguf"


async def _stream(engine, prompt: list[int], max_tokens: int) -> list[float]:
    return [time.perf_counter() async for e in engine.generate(prompt, max_tokens=max_tokens, ignore_eos=True)
            if e.token is not None]


async def tpot(a: argparse.Namespace) -> None:
    async with skippy.open_engine("smollm2", n_ctx=12288, threads=2, batch_invariant=a.inv == 1,
                                  prefix_cache=a.prefix == 1, n_seq_max=a.n_seq_max or None) as engine:
        rng, out = np.random.default_rng(5), []
        for i in range(10):
            ts = await _stream(engine, rng.integers(1000, 20000, size=128).tolist(), 128)
            if i >= 2:  # two warm-up requests
                out.append((ts[-1] - ts[0]) / (len(ts) - 1) * 1e3)
        print(f"tpot prefix={a.prefix} n_seq_max={a.n_seq_max or 'derived'} inv={a.inv}: "
              f"median {np.median(out):.2f} ms ({' '.join(f'{x:.2f}' for x in out)})")


async def ttft(a: argparse.Namespace) -> None:
    async with skippy.open_engine("smollm2", n_ctx=16384, threads=2, batch_invariant=a.inv == 1) as engine:
        rng, out = np.random.default_rng(9), []
        for i in range(22):
            s0, t = engine.stats(), time.perf_counter()
            await _stream(engine, rng.integers(1000, 20000, size=128).tolist(), 1)
            s = engine.stats()
            if i >= 2:
                out.append(((time.perf_counter() - t) * 1e3, (s.t_decode - s0.t_decode) * 1e3))
        wall, dec = np.median(np.array(out), axis=0)
        print(f"ttft inv={a.inv}: median {wall:.1f} ms, of which decode {dec:.1f} ms")


async def waves(a: argparse.Namespace) -> None:
    async with skippy.open_engine(a.model, n_ctx=12288, threads=2, prefix_cache=a.prefix == 1) as engine:
        rng = np.random.default_rng(5)
        for w in range(a.waves):
            out: list[float] = []

            async def one() -> None:
                ts = await _stream(engine, rng.integers(300, 30000, size=128).tolist(), 48)
                out.append((ts[-1] - ts[0]) / (len(ts) - 1) * 1e3)

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(one)
            print(f"waves prefix={a.prefix} wave {w}: TPOT median {np.median(out):.1f} ms", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=["tpot", "ttft", "waves"])
    p.add_argument("--prefix", type=int, default=1)
    p.add_argument("--n-seq-max", type=int, default=0)
    p.add_argument("--inv", type=int, default=1)
    p.add_argument("--waves", type=int, default=3)
    p.add_argument("--model", default=str(FALCON))
    a = p.parse_args()
    trio.run({"tpot": tpot, "ttft": ttft, "waves": waves}[a.probe], a)


if __name__ == "__main__":
    main()
