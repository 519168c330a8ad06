"""Served N=1 A/B with the engines interleaved request by request: what the N=1 gate rows hide.

    python bench/served_ab.py --engines skippy llama-server --rounds 40 --max-tokens 1 --out DIR
    python bench/served_ab.py --engines skippy skippy-fast llama-server --rounds 20 --max-tokens 64 --out DIR

Every engine runs at once (each idle while another is measured), and each round sends one
unique prompt to every engine in turn, the order rotated each round, so drift on this noisy
box (another process, thermal, page cache) lands on every engine alike. A sweep runs engines
one after another, minutes apart: its N=1 difference of 50 ms TTFT is inside that drift.
Writes `ab.json` (every record) and `ab.md` (medians, and the per-round paired differences).

Each server's CPU is read per thread around every request (/proc/PID/task/*/schedstat, ns): the
two busiest threads are the compute threads (--threads 2); what the others use per output token
(the event loop, HTTP, the runtime hand-off) is CPU the compute threads lose on a 2-core box.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gate.client import completion_body, stream_completion
from bench.gate.metrics import tpot
from bench.gate.engines import ENGINES, ServerConfig, server_argv, tools_for
from bench.gate.model import ModelSpec, read_vocab
from bench.gate.procs import free_port, running_server
from bench.gate.runner import scrape
from bench.gate.workloads import Workload, make_prompts

ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # NAME=VALUE in an engine spec: that server's environment


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """Nanoseconds on a CPU so far, per thread of process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return out


def thread_sys_s(pid: int) -> dict[str, float]:
    """Seconds in the kernel so far (stime, clock ticks), per thread of process `pid`: how much of
    the non-compute threads' CPU is syscalls (socket writes, epoll, wake-ups) rather than Python."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                out[tid] = int(f.read().rpartition(")")[2].split()[12]) / tick
        except (OSError, ValueError, IndexError):
            pass
    return out


def other_sys_s(cpu_before: dict[str, int], cpu_after: dict[str, int], sys_before: dict[str, float],
                sys_after: dict[str, float], n_compute: int) -> float:
    """Kernel seconds between two reads in every thread but the `n_compute` busiest (by CPU)."""
    busiest = sorted(cpu_after, key=lambda t: cpu_after[t] - cpu_before.get(t, 0), reverse=True)[:n_compute]
    return sum(v - sys_before.get(t, 0.0) for t, v in sys_after.items() if t not in busiest)


def busiest_and_rest_ns(before: dict[str, int], after: dict[str, int], n_compute: int) -> tuple[int, int]:
    """(ns of CPU in the `n_compute` busiest threads, ns in every other thread) between two reads."""
    d = sorted((ns - before.get(tid, 0) for tid, ns in after.items()), reverse=True)
    return sum(d[:n_compute]), sum(d[n_compute:])


def compute_and_other_s(before: dict[str, int], after: dict[str, int], n_compute: int) -> tuple[float, float]:
    """(seconds of CPU in the `n_compute` busiest threads, seconds in every other thread) between two reads."""
    busiest, rest = busiest_and_rest_ns(before, after, n_compute)
    return busiest / 1e9, rest / 1e9


def summarise(records: dict[str, list], base: str) -> list[str]:
    """Markdown: per engine the medians, and per engine the median paired difference to `base`."""
    lines = ["| engine | TTFT p50 ms | TTFT mean ms | TPOT p50 ms | e2e p50 ms | paired TTFT - base ms | "
             "paired e2e - base ms |", "|---|---|---|---|---|---|---|"]
    for eng, recs in records.items():
        ttft = [r.ttft * 1e3 for r in recs]
        e2e = [r.e2e * 1e3 for r in recs]
        tp = [t * 1e3 for t in (tpot(r) for r in recs) if t is not None]
        d_ttft = [(a.ttft - b.ttft) * 1e3 for a, b in zip(recs, records[base])]
        d_e2e = [(a.e2e - b.e2e) * 1e3 for a, b in zip(recs, records[base])]
        lines.append(f"| {eng} | {np.median(ttft):.1f} | {np.mean(ttft):.1f} | "
                     f"{np.median(tp) if tp else float('nan'):.2f} | {np.median(e2e):.1f} | "
                     f"{np.median(d_ttft):+.1f} | {np.median(d_e2e):+.1f} |")
    return lines


def engine_argv(eng: str, cfg: ServerConfig, port: int, tools: Any) -> list[str]:
    """'skippy:--no-prefix-cache' is an engine with more args; 'skippy-fast:GOMP_SPINCOUNT=3000' one run
    under that environment variable (through env(1), which execs: the pid is still the server's)."""
    base, _, extra = eng.partition(":")
    words = extra.split()
    env = [w for w in words if ENV_WORD.match(w)]
    argv = server_argv(base, cfg, port, 1, tools) + [w for w in words if not ENV_WORD.match(w)]
    return ["env", *env, *argv] if env else argv


async def run(a: argparse.Namespace) -> None:
    spec = ModelSpec.resolve(a.model)
    cfg = ServerConfig(spec, threads=a.threads, n_ctx=a.n_ctx, n_batch=a.n_batch,
                       skippy_extra=tuple(a.skippy_args), llama_server_extra=tuple(a.llama_server_args))
    tools = tools_for([e.partition(":")[0] for e in a.engines], batched_bench=False)
    vocab = read_vocab(spec.path)
    w = Workload("ab", a.input_len, a.max_tokens, 0)
    prompts = make_prompts(w, vocab, a.rounds * len(a.engines) + a.warmup * len(a.engines), seed=a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, list] = {e: [] for e in a.engines}
    inside: dict[str, list[tuple[float, float]]] = {e: [] for e in a.engines}
    cpu: dict[str, list[tuple[float, float, int]]] = {e: [] for e in a.engines}  # (compute s, other s, tokens)
    other_sys: dict[str, list[float]] = {e: [] for e in a.engines}  # the other threads' kernel seconds
    async with AsyncExitStack() as stack, httpx.AsyncClient(timeout=600) as client:
        servers = {}
        for eng in a.engines:
            port = free_port()
            argv = engine_argv(eng, cfg, port, tools)
            log = out / (re.sub(r"[^A-Za-z0-9_.-]+", "_", eng).strip("_") + ".log")
            servers[eng] = await stack.enter_async_context(running_server(argv, port, log))
        t0 = time.perf_counter()
        k = 0
        for r in range(a.warmup + a.rounds):
            order = list(a.engines[r % len(a.engines):]) + list(a.engines[:r % len(a.engines)])
            for eng in order:
                s = servers[eng]
                body = {**completion_body(s.model_id, prompts[k], a.max_tokens, 0.0, a.seed + k), **a.sampling}
                k += 1
                before = await scrape(client, s.url) if eng.startswith("skippy") else None
                cpu0, sys0 = thread_cpu_ns(s.pid), thread_sys_s(s.pid)
                rec = await stream_completion(client, s.url, body, index=r, warmup=r < a.warmup, t0=t0)
                if r >= a.warmup:
                    cpu1 = thread_cpu_ns(s.pid)
                    cpu[eng].append((*compute_and_other_s(cpu0, cpu1, a.threads), rec.output_tokens))
                    other_sys[eng].append(other_sys_s(cpu0, cpu1, sys0, thread_sys_s(s.pid), a.threads))
                after = await scrape(client, s.url) if before is not None else None
                if after is not None and r >= a.warmup:  # the server's own split of the request's time
                    inside[eng].append(((after.step_decode - before.step_decode) * 1e3,
                                        (after.step_busy - before.step_busy) * 1e3))
                if rec.error == "no token arrived" and rec.e2e is not None:  # a token whose text is
                    rec.ttft, rec.error = rec.e2e, None  # held back (a partial UTF-8 piece): its chunk's time
                if rec.error:
                    raise SystemExit(f"{eng}: {rec.error}")
                if r >= a.warmup:
                    records[eng].append(rec)
                await trio.sleep(a.gap)
            print(f"round {r}: " + " ".join(f"{e} {records[e][-1].ttft * 1e3:.0f}" for e in a.engines
                                             if records[e] and r >= a.warmup), flush=True)
    (out / "ab.json").write_text(json.dumps({"args": vars(a), "argv": {e: list(s.argv) for e, s in servers.items()},
                                             "records": {e: [attrs.asdict(x) for x in v] for e, v in records.items()},
                                             "server_decode_busy_ms": inside, "thread_cpu_s": cpu,
                                             "other_threads_sys_s": other_sys},
                                            indent=1))
    md = [f"# Served N=1 A/B, interleaved ({a.rounds} rounds, prompt {a.input_len} ids, {a.max_tokens} tokens)", "",
          "    python bench/served_ab.py " + " ".join(a.argv), "", *summarise(records, a.engines[-1]), "",
          "Server side (skippy's /metrics deltas around each request), medians:", ""]
    md += [f"- {e}: inside llama_decode {np.median([d for d, _ in v]):.1f} ms, step busy "
           f"{np.median([b for _, b in v]):.1f} ms" for e, v in inside.items() if v]
    md += ["", f"Server CPU per output token, all rounds (the {a.threads} busiest threads = compute; the rest = "
               "event loop, HTTP, hand-off):", ""]
    md += [f"- {e}: compute threads {1e3 * sum(c for c, _, _ in v) / max(1, sum(n for *_, n in v)):.2f} ms, "
           f"other threads {1e3 * sum(o for _, o, _ in v) / max(1, sum(n for *_, n in v)):.3f} ms "
           f"(of which in the kernel {1e3 * sum(other_sys[e]) / max(1, sum(n for *_, n in v)):.3f} ms)"
           for e, v in cpu.items() if v]
    (out / "ab.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", nargs="+", default=["skippy", "llama-server"],
                   help=f"of {', '.join(ENGINES)}; ENGINE:ARGS adds ARGS to its command line")
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampling", type=json.loads, default={},
                   help='body fields that replace greedy decoding, as JSON: \'{"temperature": 1, "top_k": 0, '
                        '"top_p": 1, "min_p": 0}\' samples the whole vocabulary in both engines (llama-server '
                        'fills top_k, top_p and min_p from its own defaults otherwise)')
    p.add_argument("--gap", type=float, default=0.05, help="seconds between requests")
    p.add_argument("--skippy-args", nargs="*", default=[])
    p.add_argument("--llama-server-args", nargs="*", default=[])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    a.argv = sys.argv[1:]
    trio.run(run, a)


if __name__ == "__main__":
    main()
