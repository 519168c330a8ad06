"""llama-batched-bench at the sweep's batch sizes: the raw hardware reference.

No server, no scheduler: B sequences prefill `pp` tokens and decode `tg` each over one
unified KV context (-kvu), same model, threads and batch size as the servers. Its decode
tok/s at B is the ceiling a serving engine can approach at concurrency N = B.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Sequence

import trio

from .engines import ServerConfig


def batched_argv(tool: Path, cfg: ServerConfig, pp: int, tg: int, batches: Sequence[int]) -> list[str]:
    # the context must hold every sequence of the largest batch, or the tool skips that batch
    n_ctx = max(cfg.n_ctx, max(batches) * (pp + tg) + 16)
    return [str(tool), "-m", str(cfg.model.path), "-c", str(n_ctx), "-b", str(cfg.n_batch), "-ub", str(cfg.n_batch),
            "-t", str(cfg.threads), "-tb", str(cfg.threads), "-kvu", "-npp", str(pp), "-ntg", str(tg),
            "-npl", ",".join(str(b) for b in batches), "--output-format", "jsonl"]


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The result lines of `--output-format jsonl` (the tool's other log lines are skipped)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


async def run_batched_bench(tool: Path, cfg: ServerConfig, pp: int, tg: int, batches: Sequence[int],
                            log: Path, timeout: float) -> dict[str, Any]:
    """Rows per batch size, or the error; never raises for a failed tool run."""
    argv = batched_argv(tool, cfg, pp, tg, batches)
    entry: dict[str, Any] = {"pp": pp, "tg": tg, "argv": argv, "rows": []}
    try:
        with trio.fail_after(timeout):
            done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False,
                                          stdin=subprocess.DEVNULL)
    except (trio.TooSlowError, OSError) as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        return entry
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(out + "\n--- stderr ---\n" + err)
    entry["rows"] = parse_jsonl(out + "\n" + err)
    if done.returncode != 0 or not entry["rows"]:
        entry["error"] = f"exit {done.returncode}; see {log.name}"
    return entry
