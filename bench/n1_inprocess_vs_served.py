"""N=1 TPOT in-process against served, interleaved request by request: is the gap the engine or HTTP?

    python bench/n1_inprocess_vs_served.py [--inprocess engine|loop] [--rounds 10] [--max-tokens 128] [--out DIR]

Three streams per round, the order rotated each round, one unique 128-token prompt each round,
greedy, SmolLM2, 2 threads, n_ctx 16384, the default (not batch-invariant) kernels everywhere:
- **in-process**: `--inprocess engine` streams from skippy's engine in this process (the actors, the
  worker thread, no HTTP); `--inprocess loop` is the floor: the same runtime and worker thread
  driven by a minimal chained loop (decode, argmax, the next decode queued before the token is
  handed over), no scheduler;
- **skippy-fast**: `skippy serve --no-batch-invariant`, streamed by the gate's client;
- **llama-server**: the same-tree llama-server (`-np 1 -kvu`), the same client.
Only one in-process context at a time: two (an engine and a loop) would each keep a ggml thread
team, and the idle one's spinning would slow the other.

Also per request for `engine` and skippy-fast: the wall time inside llama_decode (engine.stats(),
/metrics), which says whether the served gap is in the decode or between decodes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import numpy as np
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gate.client import completion_body, stream_completion  # noqa: E402
from bench.gate.engines import ServerConfig, server_argv, tools_for  # noqa: E402
from bench.gate.metrics import tpot  # noqa: E402
from bench.gate.model import ModelSpec  # noqa: E402
from bench.gate.procs import free_port, running_server  # noqa: E402
from bench.gate.runner import scrape  # noqa: E402

SERVED = ("skippy-fast", "llama-server")


async def engine_stream(engine, prompt: list[int], n: int) -> tuple[float, float]:
    s0 = engine.stats()
    ts = [time.perf_counter() async for e in engine.generate(prompt, max_tokens=n, ignore_eos=True)
          if e.token is not None]
    return (ts[-1] - ts[0]) / (len(ts) - 1), engine.stats().t_decode - s0.t_decode


def open_loop(n_ctx: int, threads: int):
    """The floor's runtime and worker: one context, one lane."""
    from skippy.actors.worker import Worker
    from skippy.engine import EngineConfig, _open_runtime

    rt, _ = _open_runtime("smollm2", EngineConfig(n_ctx=n_ctx, threads=threads, batch_invariant=False, n_seq_max=1))
    return rt, Worker("floor")


async def loop_stream(rt, worker, prompt: list[int], n: int) -> tuple[float, float]:
    """Prefill, then n-1 chained greedy decodes; the next decode is queued before a token is handed on."""
    from skippy.sampling import Sampler, SamplingParams

    sampler = Sampler(SamplingParams(temperature=0.0), np.array(prompt))
    rt.seq_rm(0)
    k = len(prompt)
    outs = np.zeros(k, np.int8)
    outs[-1] = 1
    first = await worker.run(lambda: rt.decode_sample(np.array(prompt, np.int32), np.arange(k, dtype=np.int32),
                                                      np.zeros(k, np.int32), outs, (sampler,)))
    tok, pos, one, zero = np.array(first.tokens[:1], np.int32), [k], np.ones(1, np.int8), np.zeros(1, np.int32)
    t_decode = [first.t_decode]  # the prefill's decode too, as the engine's and the server's figures count it

    def step() -> tuple[int, bytes]:
        r = rt.decode_sample(tok, np.array(pos, np.int32), zero, one, (sampler,))
        tok[0], pos[0] = r.tokens[0], pos[0] + 1
        t_decode[0] += r.t_decode
        return int(r.tokens[0]), rt.piece(int(r.tokens[0]))

    t0 = time.perf_counter()
    job = worker.start(step)
    for i in range(n - 1):
        await job.result()
        if i + 2 < n:
            job = worker.start(step)
    return (time.perf_counter() - t0) / (n - 1), t_decode[0]


async def run(a: argparse.Namespace) -> dict:
    cfg = ServerConfig(ModelSpec.resolve("smollm2", None), threads=a.threads, n_ctx=a.n_ctx)
    tools = tools_for(list(SERVED), batched_bench=False)
    names = ["in-process", *SERVED]
    out: dict[str, list[tuple[float, float]]] = {e: [] for e in names}
    logs = Path(tempfile.mkdtemp(prefix="n1-inprocess-vs-served-"))
    rng = np.random.default_rng(a.seed)
    async with AsyncExitStack() as stack:
        servers = {}
        for e in SERVED:
            port = free_port()
            servers[e] = await stack.enter_async_context(
                running_server(server_argv(e, cfg, port, 1, tools), port, logs / f"{e}.log"))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=120))
        if a.inprocess == "engine":
            import skippy

            engine = await stack.enter_async_context(
                skippy.open_engine("smollm2", n_ctx=a.n_ctx, threads=a.threads, batch_invariant=False))
            local = lambda p: engine_stream(engine, p, a.max_tokens)  # noqa: E731
        else:
            rt, worker = open_loop(a.n_ctx, a.threads)
            stack.callback(rt.close)
            stack.callback(worker.close)  # callbacks run last first: the worker stops before its runtime closes
            local = lambda p: loop_stream(rt, worker, p, a.max_tokens)  # noqa: E731
        for r in range(a.rounds + 1):  # round 0 warms every engine up
            prompt = rng.integers(1000, 20000, size=128).tolist()
            for e in names[r % 3:] + names[: r % 3]:
                if e == "in-process":
                    v, dec = await local(prompt)
                else:
                    srv = servers[e]
                    before = await scrape(client, srv.url)
                    rec = await stream_completion(client, srv.url, completion_body(srv.model_id, prompt, a.max_tokens, 0.0, 0),
                                                  index=r, warmup=r == 0, t0=0.0)
                    after = await scrape(client, srv.url)
                    v, dec = tpot(rec), float("nan")
                    if before is not None and after is not None and None not in (before.step_decode, after.step_decode):
                        dec = after.step_decode - before.step_decode  # skippy's /metrics; llama-server has none
                if r > 0 and v is not None:
                    out[e].append((v, dec))
    base = float(np.median([v for v, _ in out["llama-server"]]))
    return {e: {"tpot_ms": round(1e3 * float(np.median([v for v, _ in xs])), 3),
                "vs_llama_server": round(float(np.median([v for v, _ in xs])) / base, 3),
                "decode_s_per_request": round(float(np.median([d for _, d in xs])), 3),
                "tpot_ms_each": [round(1e3 * v, 2) for v, _ in xs]} for e, xs in out.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--inprocess", choices=("engine", "loop"), default="engine")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    result = trio.run(run, a)
    command = "python bench/n1_inprocess_vs_served.py " + " ".join(sys.argv[1:])
    label = {"engine": "in-process engine", "loop": "in-process loop (floor)"}[a.inprocess]
    lines = [f"# N=1 TPOT, in-process vs served, interleaved ({a.rounds} rounds x {a.max_tokens} tokens)", "",
             f"    {command}", "", "| stream | TPOT p50 ms | vs llama-server | inside llama_decode per request s |",
             "|---|---|---|---|"]
    for e, r in result.items():
        dec = "-" if r["decode_s_per_request"] != r["decode_s_per_request"] else f"{r['decode_s_per_request']:.3f}"
        lines.append(f"| {label if e == 'in-process' else e} | {r['tpot_ms']:.3f} | {r['vs_llama_server']:.3f}x | {dec} |")
    print("\n".join(lines))
    if a.out:
        d = Path(a.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{a.inprocess}.json").write_text(json.dumps({"command": command, "streams": result}, indent=1) + "\n")
        (d / f"{a.inprocess}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
