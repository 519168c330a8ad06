"""Where a served token's time goes: `skippy serve` under py-spy while N streaming clients run.

    python bench/profile_served.py --model smollm2 --sessions 1 --requests 4 --max-tokens 256 \
        [--skippy-args "--no-batch-invariant"] [--out bench/results/token-latency/profile-n1]

Writes `<out>/profile.txt` (py-spy's collapsed stacks), `<out>/summary.json` and
`<out>/summary.md`: per Python thread, the share of samples, and on the event-loop thread the
share of each part of the per-token path (engine step, actor hops, SSE encoding and writing,
HTTP, the client-side wait), plus the server's own overhead figure from /metrics for the
same run, so the two can be compared. The client runs in this process, not the server's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gate.client import completion_body, stream_completion  # noqa: E402
from bench.gate.procs import free_port  # noqa: E402

# what a frame's function/file says about which part of the path it is (first match wins, leaf first)
PARTS = [
    ("idle (waiting for work)", ("EpollIOManager.get_events", "_epoll_wait", "Worker._loop", "wait_woken")),
    ("decode (llama_decode)", ("decode (skippy/native/context.py", "llama_decode")),
    ("sampling + detokenize", ("sample_rows", "skippy/sampling.py", "piece (skippy/native/tokenizer.py",
                               "is_eog (skippy/native/tokenizer.py")),
    ("SSE encode + write", ("sse_starlette", "_sse (skippy/server/app.py")),
    ("JSON + chunk shape", ("json/", "skippy/server/protocol.py")),
    ("HTTP server (hypercorn/h11)", ("hypercorn", "h11/")),
    ("ASGI/anyio/starlette", ("anyio/", "starlette/")),
    ("step scheduler (pure)", ("skippy/scheduling/",)),
    ("actors + channels", ("skippy/actors/", "trio/_channel", "skippy/engine.py")),
    ("trio scheduler", ("trio/_core",)),
]


def classify(stack: str) -> str:
    frames = stack.split(";")[::-1]  # leaf first
    if frames and any(n in frames[0] for n in PARTS[0][1]):  # blocked in a wait (py-spy counts some waits as active)
        return PARTS[0][0]
    for frame in frames:
        for name, needles in PARTS:
            if any(n in frame for n in needles):
                return name
    return "other"


def summarize(collapsed: Path) -> dict:
    threads: Counter = Counter()
    parts: dict[str, Counter] = {}
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        thread = stack.split(";", 1)[0]
        threads[thread] += n
        parts.setdefault(thread, Counter())[classify(stack)] += n
    total = sum(threads.values()) or 1
    return {
        "samples": total,
        "threads": {t: round(100 * n / total, 1) for t, n in threads.most_common()},
        "parts": {t: {k: round(100 * v / max(1, threads[t]), 1) for k, v in c.most_common()}
                  for t, c in parts.items()},
    }


async def drive(url: str, sessions: int, requests: int, max_tokens: int, prompt_len: int) -> list:
    out = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker(w: int) -> None:
            for i in range(requests):
                prompt = [(w * 131 + i * 17 + k * 7) % 4000 + 100 for k in range(prompt_len)]
                body = completion_body("skippy", prompt, max_tokens, 0.0, 0)
                out.append(await stream_completion(client, url, body, index=len(out), warmup=False, t0=t0))

        async with trio.open_nursery() as nursery:
            for w in range(sessions):
                nursery.start_soon(worker, w)
    return out


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    want = ("skippy_step_busy_seconds_total", "skippy_step_decode_seconds_total", "skippy_step_overhead_ratio")
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith(want)}


def add_server_options(p: argparse.ArgumentParser) -> None:
    """The served run's shape, shared with bench/profile_calls.py."""
    p.add_argument("--model", default="smollm2")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--skippy-args", default="")


def wait_healthy(url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_options(p)
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--out", default=str(ROOT / "bench/results/token-latency/profile"))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "skippy", "serve", "--model", a.model, "--port", str(port),
            "--threads", str(a.threads), "--n-ctx", str(a.n_ctx), "--served-model-name", "skippy",
            *shlex.split(a.skippy_args)]
    server = subprocess.Popen(argv, cwd=ROOT, stderr=open(out / "server.log", "w"))
    try:
        wait_healthy(url)
        trio.run(drive, url, 1, 1, 8, a.prompt_len)  # warm-up, not profiled
        before = scrape(url)
        spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(server.pid), "--rate", str(a.rate),
                                "--format", "raw", "--threads", "--nonblocking", "--output", str(out / "profile.txt")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        t = time.perf_counter()
        records = trio.run(drive, url, a.sessions, a.requests, a.max_tokens, a.prompt_len)
        wall = time.perf_counter() - t
        after = scrape(url)
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    tokens = sum(r.output_tokens for r in records)
    busy = after.get("skippy_step_busy_seconds_total", 0) - before.get("skippy_step_busy_seconds_total", 0)
    decode = after.get("skippy_step_decode_seconds_total", 0) - before.get("skippy_step_decode_seconds_total", 0)
    result = {
        "command": " ".join(shlex.quote(x) for x in sys.argv),
        "server": " ".join(argv),
        "tokens": tokens, "wall_s": round(wall, 3), "out_tok_per_s": round(tokens / wall, 2),
        "ms_per_token_per_stream": round(1e3 * wall * a.sessions / max(1, tokens), 3),
        "engine_step_overhead_pct": round(100 * (busy - decode) / busy, 2) if busy else None,
        "engine_decode_ms_per_step": None,
        "profile": summarize(out / "profile.txt"),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Served-path profile: {a.sessions} session(s), {a.requests} x {a.max_tokens} tokens",
             "", f"Command: `{result['command']}`", f"Server: `{result['server']}`", "",
             f"{tokens} tokens in {wall:.2f} s: {result['out_tok_per_s']} tok/s, "
             f"{result['ms_per_token_per_stream']} ms per token per stream; engine step overhead "
             f"(/metrics: busy wall outside llama_decode) {result['engine_step_overhead_pct']}%", "",
             "| thread | share of samples |", "|---|---|"]
    lines += [f"| {t} | {v}% |" for t, v in result["profile"]["threads"].items()]
    for t, parts in result["profile"]["parts"].items():
        lines += ["", f"## {t}", "", "| part | share of this thread's samples |", "|---|---|"]
        lines += [f"| {k} | {v}% |" for k, v in parts.items()]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
