"""What a burst of arrivals costs the last prompt: tokens streamed before it starts, against a floor.

    python bench/wave_cost.py bench/results/gate-n32-wave/results.json [--itl-bound-ms 500]

At N=32 every engine's TTFT p99 is the first wave's last prompt. Its first token waits for every
prompt before it, and also for every token streamed meanwhile: on a box with no batching gain
(bench/results/frontier-n32), a decode row costs about what a prompt token costs. So the rows that
are streamed during the wave are what keeps inter-token gaps short, paid for in that prompt's TTFT.

For each run this prints:
- `t_last`: when the first wave's last first token came;
- `streamed`: tokens delivered by then, first tokens included;
- `floor`: the fewest tokens that keep every stream's gaps within `--itl-bound-ms` up to `t_last`.
  That is, for each stream, (t_last - its first token) / bound, capped at what it generates.
  A scheduler whose ITL p99 is within the bound streams at least about this many (its 1% tail
  aside), whatever its policy.

The first wave is the `--concurrency` earliest measured requests. A run that pools K rounds
(`--rounds`: `merge_rounds` keeps each round's requests together, warm-up included, in round
order) is cut into K equal parts, and each round's wave is reported on its own line.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence


def wave_cost(requests: Sequence[dict[str, Any]], wave: int, itl_bound_s: float) -> dict[str, float]:
    """`requests`: a run's records (t_send, ttft, itl, output_tokens); warm-up ones are skipped."""
    recs = sorted((r for r in requests if not r.get("warmup") and r.get("ttft") is not None),
                  key=lambda r: r["t_send"])
    if len(recs) < wave:
        raise ValueError(f"{len(recs)} measured requests, fewer than a wave of {wave}")
    t0 = recs[0]["t_send"]
    firsts = [r["t_send"] + r["ttft"] - t0 for r in recs[:wave]]
    t_last = max(firsts)
    streamed = 0
    for r in recs:
        t = r["t_send"] + r["ttft"] - t0
        for gap in [0.0, *r["itl"]]:
            t += gap
            if t > t_last:
                break
            streamed += 1
    floor = 0
    for r, t_first in zip(recs[:wave], firsts):
        floor += min(r["output_tokens"], 1 + math.floor((t_last - t_first) / itl_bound_s))
    return {"t_last": t_last, "streamed": streamed, "floor": floor}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--itl-bound-ms", type=float, default=500.0)
    a = p.parse_args(argv)
    doc = json.loads(a.results.read_text())
    print(f"| workload | engine | t_last s | streamed by then | floor at ITL <= {a.itl_bound_ms:g} ms |")
    print("|---|---|---|---|---|")
    for run in doc["runs"]:
        if run["load"].get("n") != a.concurrency:
            continue
        k = len(run.get("server", {}).get("rounds") or [None])
        for i, part in enumerate(split_rounds(run["requests"], k)):
            c = wave_cost(part, a.concurrency, a.itl_bound_ms / 1e3)
            name = run["engine"] + (f" (round {i + 1})" if k > 1 else "")
            print(f"| {run['workload']} | {name} | {c['t_last']:.2f} | {c['streamed']} | {c['floor']} |")
    return 0


def split_rounds(requests: Sequence[dict[str, Any]], k: int) -> list[list[dict[str, Any]]]:
    """A pooled run's requests cut into its `k` rounds (each the same size), as `merge_rounds` stores them:
    round after round. Not by time: a round's warm-up is sent before the shift its start is given."""
    recs = list(requests)
    if k < 1 or len(recs) % k:
        raise ValueError(f"{len(recs)} requests do not split into {k} equal rounds")
    n = len(recs) // k
    return [recs[i * n:(i + 1) * n] for i in range(k)]


if __name__ == "__main__":
    raise SystemExit(main())
