"""CPU per streamed token of `skippy serve`, per thread group, with the fixed cost of a request cancelled out.

    python bench/cpu_per_token.py --engine skippy-fast [--pairs 6] [--out DIR]
    python bench/cpu_per_token.py --engine llama-server                          # the same figures for it
    python bench/cpu_per_token.py --family llama --threads 1 --prompt-len 16   # the same Python path on an idle core

One server, N=1. Each pair streams a short request (`--short` tokens) and then a long one
(`--short + 256`). Every thread's CPU is read (`/proc/PID/task/*/schedstat`) around each request.
Per token, per pair: (CPU over the long request - over the short one) / 256. What a request costs
once (parsing, tokenizing, the prompt) is in both requests and cancels out. The pairs' median is
reported for:
- **compute**: the `--threads` busiest threads, which are ggml's: the worker thread that calls
  llama_decode, and the pool;
- **other**: the event loop, HTTP and the hand-off;
- **main**: the event-loop thread alone.

On a 2-core box, "other" is CPU the compute threads lose. `bench/served_ab.py`'s per-token figure
divides all of a request's CPU by its tokens, so it also contains the per-request cost.
The same Python path costs about 4x more next to SmolLM2's decode than on an idle core
(`--family llama`, a tiny synthetic model whose decode is almost free). See
bench/results/n1-contention.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gate.procs import free_port  # noqa: E402
from bench.profile_served import drive, wait_healthy  # noqa: E402
from bench.served_ab import busiest_and_rest_ns, thread_cpu_ns  # noqa: E402

LONG_EXTRA = 256


def stream(url: str, max_tokens: int, prompt_len: int) -> None:
    """One streamed request; a failed or short one stops the run (a pair of them would read as ~0 CPU)."""
    (rec,) = trio.run(drive, url, 1, 1, max_tokens, prompt_len)
    if rec.error is not None or rec.output_tokens != max_tokens:
        raise SystemExit(f"a request failed ({rec.error or f'{rec.output_tokens} of {max_tokens} tokens'}); "
                         "a tiny model (--family) needs a short --prompt-len, e.g. 16")


def split_ns(before: dict[str, int], after: dict[str, int], n_compute: int, main_tid: str) -> tuple[int, int, int]:
    """(compute, other, main) nanoseconds between two readings: compute = the `n_compute` threads that
    used the most, main = the event-loop thread (the process's first)."""
    compute, other = busiest_and_rest_ns(before, after, n_compute)
    return compute, other, after.get(main_tid, 0) - before.get(main_tid, 0)


def per_token(short: tuple[int, int, int], long: tuple[int, int, int], extra: int) -> tuple[float, float, float]:
    """Microseconds per token of each group: the long request's CPU less the short one's, over the extra tokens."""
    return tuple((b - a) / extra / 1e3 for a, b in zip(short, long))  # type: ignore[return-value]


def server_command(a: argparse.Namespace, port: int) -> list[str]:
    """The engine's command line as the gate runs it (bench.gate.engines), answering to the model name "skippy"."""
    from bench.gate.engines import ServerConfig, server_argv, tools_for
    from bench.gate.model import ModelSpec

    cfg = ServerConfig(ModelSpec.resolve(a.model, a.family), threads=a.threads, n_ctx=a.n_ctx,
                       skippy_extra=tuple(shlex.split(a.skippy_args)))
    argv = server_argv(a.engine, cfg, port, 1, tools_for([a.engine], batched_bench=False))
    return argv + (["--alias", "skippy"] if a.engine == "llama-server" else ["--served-model-name", "skippy"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="skippy", choices=("skippy", "skippy-fast", "llama-server"),
                   help="llama-server: the same-tree server, for its CPU per token by the same method")
    p.add_argument("--model", default=None, help="a model name or path (default: skippy's embedded model)")
    p.add_argument("--family", default=None, help="a tiny synthetic model instead (e.g. llama)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--short", type=int, default=8)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--skippy-args", default="")
    p.add_argument("--out", default=None, help="write cpu.json here")
    a = p.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = server_command(a, port)
    server = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.DEVNULL)
    pairs = []
    try:
        wait_healthy(url)
        stream(url, 16, a.prompt_len)  # warm-up
        tid = str(server.pid)
        for _ in range(a.pairs):
            c0 = thread_cpu_ns(server.pid)
            stream(url, a.short, a.prompt_len)
            c1 = thread_cpu_ns(server.pid)
            stream(url, a.short + LONG_EXTRA, a.prompt_len)
            c2 = thread_cpu_ns(server.pid)
            pairs.append(per_token(split_ns(c0, c1, a.threads, tid), split_ns(c1, c2, a.threads, tid), LONG_EXTRA))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(120)
    med = {k: round(statistics.median(x[i] for x in pairs), 1) for i, k in enumerate(("compute", "other", "main"))}
    command = "python bench/cpu_per_token.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    result = {"command": command, "server": argv[1:], "us_per_token_median": med,
              "pairs_us_per_token": [[round(v, 1) for v in x] for x in pairs]}
    print(f"us per token (median of {len(pairs)} pairs): compute {med['compute']}, other {med['other']}, "
          f"event loop {med['main']}")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
