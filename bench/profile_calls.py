"""Python calls per streamed token on `skippy serve`'s event loop: an exact count where time is noise.

    python bench/profile_calls.py --out bench/results/n1-lean-path/calls [--skippy-args="--no-batch-invariant"] [--sessions N]

On a 2-core box every call the event loop makes per token is CPU taken from a compute thread,
and timings there drift by 20-30% between runs; a call count does not. The server runs with
cProfile on its event-loop thread (cProfile follows only the thread that enables it), enabled
from the second streamed request on (the first warms up), over `--requests` streams of
`--max-tokens` tokens, one at a time (or `--sessions` streams at once, each running `--requests`).
Counts are exact; cProfile counts each resumption of a coroutine or generator as a call. Writes
`<out>/calls.json` and `<out>/calls.md`: calls per token in total, by package, and the functions
that make the most. Microseconds are cProfile's, inflated by its own overhead: for ranking, not
for budgets.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import json
import os
import pstats
import shlex
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def serve_child(prof_out: str, argv: list[str]) -> int:
    """`skippy serve` with cProfile on the event loop from the second stream on."""
    import skippy.server.app as app
    from skippy.cli import main as skippy_main

    profile, streams = cProfile.Profile(), []
    sse = app._sse

    def counted_sse(*args, **kwargs):
        streams.append(1)
        if len(streams) == 2:
            profile.enable()
        return sse(*args, **kwargs)

    app._sse = counted_sse

    def dump() -> None:
        profile.disable()
        profile.dump_stats(prof_out)

    atexit.register(dump)
    return skippy_main(argv)


def where(filename: str, func: str) -> str:
    """The package (or skippy module) a profiled function belongs to."""
    if filename == "~":
        return "builtins (C)"
    if "site-packages/" in filename:
        return filename.split("site-packages/")[1].split("/")[0]
    if "/skippy/" in filename:
        return "skippy/" + filename.split("/skippy/")[1]
    if filename.startswith("<attrs generated"):
        return "attrs-generated"
    return "stdlib " + Path(filename).name


def summarize(prof: str, tokens: int) -> dict:
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    by_where: Counter = Counter()
    funcs = []
    for (filename, line, func), (_, calls, tottime, _, _) in stats.items():
        by_where[where(filename, func)] += calls
        funcs.append((calls / tokens, tottime / tokens * 1e6, f"{filename.split('site-packages/')[-1]}:{line}:{func}"))
    funcs.sort(reverse=True)
    return {"tokens": tokens, "calls_per_token": round(sum(by_where.values()) / tokens, 1),
            "by_package": {k: round(v / tokens, 1) for k, v in by_where.most_common()},
            "top_functions": [{"calls_per_token": round(c, 2), "us_per_token_cprofile": round(us, 1), "function": f}
                              for c, us, f in funcs[:40]]}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "serve-child":
        return serve_child(sys.argv[2], sys.argv[3:])
    import trio

    from bench.gate.procs import free_port
    from bench.profile_served import add_server_options, drive, wait_healthy

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_options(p)
    p.add_argument("--out", required=True)
    p.add_argument("--keep-prof", action="store_true", help="keep <out>/event-loop.prof (pstats) for a closer look")
    p.add_argument("--sessions", type=int, default=1, help="streams at once, each running --requests in turn")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prof = out / "event-loop.prof"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["serve", "--model", a.model, "--port", str(port), "--threads", str(a.threads), "--n-ctx", str(a.n_ctx),
            "--served-model-name", "skippy", *shlex.split(a.skippy_args)]
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve-child", str(prof), *argv],
                              cwd=ROOT, stderr=open(out / "server.log", "w"), env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_healthy(url)
        trio.run(drive, url, 1, 1, 8, a.prompt_len)  # the warm-up stream: not profiled
        records = trio.run(drive, url, a.sessions, a.requests, a.max_tokens, a.prompt_len)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(120)
    tokens = sum(r.output_tokens for r in records)
    summary = {"command": "python bench/profile_calls.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
               **summarize(str(prof), tokens)}
    if not a.keep_prof:
        prof.unlink()  # binary and machine-specific; the summary is what is kept
    (out / "calls.json").write_text(json.dumps(summary, indent=1) + "\n")
    load = f"N={a.sessions}, {a.requests} each" if a.sessions > 1 else "N=1"
    md = [f"# Event-loop Python calls per streamed token ({a.sessions * a.requests} x {a.max_tokens} tokens, {load})", "",
          f"    {summary['command']}", "", f"**{summary['calls_per_token']} calls per token** over {tokens} tokens.", "",
          "| where | calls per token |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in list(summary["by_package"].items())[:25]]
    md += ["", "| calls per token | us per token (cProfile) | function |", "|---|---|---|"]
    md += [f"| {f['calls_per_token']} | {f['us_per_token_cprofile']} | `{f['function']}` |" for f in summary["top_functions"]]
    (out / "calls.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
