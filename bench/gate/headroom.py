"""The hardware's batching headroom H per workload, from the sweep's llama-batched-bench rows: pure.

H = llama-batched-bench's aggregate tok/s (prompt and generated tokens over the whole time, its
`speed` column) at B = N* over B = 1, with the workload's prompt and output lengths. The gate's
2x row against single-lane scales with it (the ruling on the margins): on a 2-core CPU a prompt
token and a decode row cost about the same, and no scheduler batches its way past what B = N*
gives the kernels themselves.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

SHARE = 0.9  # the 2x row asks min(2, SHARE x H)


@attrs.frozen
class Headroom:
    h: float
    speed_1: float
    speed_n: float
    at_n: int
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def headroom(batched: Sequence[Mapping[str, Any]], pp: int, tg: int, at_n: int) -> Headroom | None:
    """H from the entry measured at (pp, tg) with rows at B = 1 and B = at_n; None without them."""
    for entry in batched:
        if entry.get("pp") != pp or entry.get("tg") != tg:
            continue
        rows = {int(r["pl"]): float(r["speed"]) for r in entry.get("rows", []) if r.get("speed")}
        if 1 in rows and at_n in rows and rows[1] > 0:
            return Headroom(rows[at_n] / rows[1], rows[1], rows[at_n], at_n, tuple(map(str, entry.get("argv", ()))))
    return None


def headrooms(meta: Mapping[str, Any] | None, batched: Sequence[Mapping[str, Any]], at_n: int) -> dict[str, Headroom]:
    """Per workload of a sweep (its meta names their lengths), the H its batched-bench rows give."""
    out: dict[str, Headroom] = {}
    for w in (meta or {}).get("workloads", []):
        h = headroom(batched, int(w["input_len"]), int(w["output_len"]), at_n)
        if h is not None:
            out[w["name"]] = h
    return out


def scaled_ratio(ratio: float, h: Headroom | None) -> float:
    """The throughput ratio asked of skippy against single-lane: min(ratio, SHARE x H) where H is known."""
    return ratio if h is None else min(ratio, SHARE * h.h)
