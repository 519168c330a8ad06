"""soak.png: the soak's samples over time, one panel per thing that must not grow or drift.

RSS; open fds and threads; KV cells in use (with the prefix cache's resident tokens, and the
running / waiting counts); p99 latency per sample period (thin) and per criterion window (steps);
the server's CPU share and the machine's load average (a latency spike while the server got less
CPU is the box, not the server).
The warm-up and the idle tail after the load are shaded. matplotlib (Agg) is imported here only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, t = result["samples"], result["totals"]
    x = [s["t"] / 60 for s in samples]
    fig, ax = plt.subplots(6, 1, figsize=(10, 15), sharex=True)
    ax[0].plot(x, [s["rss_mib"] for s in samples], color="tab:blue")
    ax[0].set_ylabel("server RSS (MiB)")
    ax[1].plot(x, [s["fds"] for s in samples], color="tab:orange")
    ax[1].set_ylabel("open fds")
    ax[2].plot(x, [s["threads"] for s in samples], color="tab:green")
    ax[2].set_ylabel("threads")
    _kv(ax[3], x, samples)
    _latency(ax[4], result)
    _cpu(ax[5], x, samples)
    for a in ax:
        a.axvspan(min(x + [0]), t["warmup_s"] / 60, color="0.9", zorder=0)
        a.axvspan(t["load_s"] / 60, max(x + [t["load_s"] / 60]), color="0.93", zorder=0)
        a.grid(alpha=0.3)
    ax[-1].set_xlabel("minutes since the load started (shaded: warm-up, idle after the load)")
    verdict = "PASS" if result["ok"] else "FAIL"
    fig.suptitle(f"skippy serve soak: {t['load_s'] / 60:g} min at {t['rate_per_s']:g} req/s, "
                 f"{t['requests']} requests: {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _kv(a: Any, x: list[float], samples: list[dict[str, Any]]) -> None:
    a.plot(x, [s["kv_used"] for s in samples], color="tab:purple", label="KV cells in use")
    a.plot(x, [s["prefix_resident"] for s in samples], color="tab:gray", ls="--", label="prefix cache resident")
    a.set_ylabel("KV cells")
    b = a.twinx()
    b.plot(x, [s["running"] for s in samples], color="tab:red", lw=0.8, alpha=0.7, label="running")
    b.plot(x, [s["waiting"] for s in samples], color="tab:brown", lw=0.8, alpha=0.7, label="waiting")
    b.set_ylabel("requests")
    lines = a.get_legend_handles_labels()
    more = b.get_legend_handles_labels()
    a.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)


def _latency(a: Any, result: dict[str, Any]) -> None:
    per = result.get("sample_latency") or []
    for key, color, label in (("total_p99", "tab:blue", "request"), ("ttft_p99", "tab:orange", "first token")):
        pts = [((w["t0"] + w["t1"]) / 120, w[key] * 1000) for w in per if w[key] is not None]
        if pts:
            a.plot(*zip(*pts), color=color, lw=0.6, alpha=0.5, label=f"p99 {label} per sample")
        steps = [w for w in result["windows"] if w[key] is not None]
        for i, w in enumerate(steps):
            a.hlines(w[key] * 1000, w["t0"] / 60, w["t1"] / 60, color=color, lw=2.2,
                     label=f"p99 {label} per window" if i == 0 else None)
    a.set_ylabel("latency (ms)")
    a.legend(loc="upper left", fontsize=8)


def _cpu(a: Any, x: list[float], samples: list[dict[str, Any]]) -> None:
    pct = [(x[i], 100 * (b["cpu_s"] - s["cpu_s"]) / (b["t"] - s["t"]))
           for i, (s, b) in enumerate(zip(samples, samples[1:]), 1) if b["t"] > s["t"]]
    if pct:
        a.plot(*zip(*pct), color="tab:cyan", lw=0.8, label="server CPU %")
    a.set_ylabel("server CPU (%)")
    b = a.twinx()
    b.plot(x, [s["load1"] for s in samples], color="0.4", lw=0.8, label="machine load average")
    b.set_ylabel("load average")
    lines, more = a.get_legend_handles_labels(), b.get_legend_handles_labels()
    a.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
