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
    # The tool prints through llama.cpp's asynchronous logger, whose queue is never flushed at exit
    # (common_log_main() is a leaked singleton): lines queued just before exit are lost, often all of
    # them on a tiny model. A last, sacrificial run of the smallest batch keeps the process alive while
    # the real lines are written; its own line, if any, is ignored (parse keeps a size's first row).
    plan = [*batches, min(batches)]
    return [str(tool), "-m", str(cfg.model.path), "-c", str(n_ctx), "-b", str(cfg.n_batch), "-ub", str(cfg.n_batch),
            "-t", str(cfg.threads), "-tb", str(cfg.threads), "-kvu", "-npp", str(pp), "-ntg", str(tg),
            "-npl", ",".join(str(b) for b in plan), "--output-format", "jsonl"]


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


async def _run_once(argv: list[str], timeout: float) -> tuple[int, str]:
    with trio.fail_after(timeout):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout.decode(errors="replace") + "\n--- stderr ---\n" + done.stderr.decode(errors="replace")


async def run_batched_bench(tool: Path, cfg: ServerConfig, pp: int, tg: int, batches: Sequence[int],
                            log: Path, timeout: float, attempts: int = 3) -> dict[str, Any]:
    """Rows per batch size, or the error; never raises for a failed tool run. Batch sizes still
    without a row (see batched_argv: lines lost at exit) are run again, up to `attempts` times."""
    entry: dict[str, Any] = {"pp": pp, "tg": tg, "argv": batched_argv(tool, cfg, pp, tg, batches), "rows": []}
    rows: dict[int, dict[str, Any]] = {}
    outputs, missing, code = [], list(batches), 0
    for _ in range(attempts):
        try:
            code, text = await _run_once(batched_argv(tool, cfg, pp, tg, missing), timeout)
        except (trio.TooSlowError, OSError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            break
        outputs.append(text)
        for r in parse_jsonl(text):  # the first row of each size: a later one is the sacrificial run
            if int(r["pl"]) in missing and int(r["pl"]) not in rows:
                rows[int(r["pl"])] = r
        missing = [b for b in batches if b not in rows]
        if not missing or code != 0:
            break
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n=== next attempt ===\n".join(outputs))
    entry["rows"] = [rows[b] for b in sorted(rows)]
    if missing and "error" not in entry:
        entry["error"] = f"exit {code}; no result for B={','.join(map(str, missing))}; see {log.name}"
    return entry
