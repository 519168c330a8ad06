"""Printing a run's invariants and writing its results: results.json + summary.md.

`--out NAME` writes under stress/results/NAME/; a value with a path separator is used as the
directory itself (tests write to a temporary one).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence, TextIO

from .invariants import Check

RESULTS = Path(__file__).resolve().parent / "results"


def out_dir(out: str | Path) -> Path:
    out = Path(out)
    return out if len(out.parts) > 1 or out.is_absolute() else RESULTS / out


def provenance() -> dict[str, Any]:
    """The commit the run used, and which of skippy's files differed from it (a run on a dirty tree
    says so)."""
    import subprocess

    repo = RESULTS.parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [line[3:] for line in git("status", "--porcelain", "--", "skippy", "patches").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "skippy_changes_not_committed": dirty}


def summary(name: str, command: str, config: dict[str, Any], checks: Sequence[Check],
            rounds: Sequence[dict[str, Any]], totals: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "ok": all(c.ok for c in checks),
        "command": command,
        "provenance": provenance(),
        "config": config,
        "invariants": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        "totals": totals,
        "rounds": list(rounds),
    }


def print_checks(checks: Sequence[Check], file: TextIO | None = None) -> None:
    for c in checks:
        print(c.line(), file=file or sys.stderr, flush=True)


def markdown(result: dict[str, Any]) -> str:
    """The printed invariants and the headline numbers, for stress/results/<name>/summary.md."""
    lines = [f"# Stress run: {result['name']}", "", f"Result: **{'PASS' if result['ok'] else 'FAIL'}**", "",
             "Command:", "", "```bash", result["command"], "```", ""]
    prov = result.get("provenance") or {}
    if prov:
        lines += [f"At commit `{prov.get('commit')}`" + (f"; skippy files not committed then: "
                  f"{', '.join(prov['skippy_changes_not_committed'])}" if prov.get("skippy_changes_not_committed")
                  else "; skippy as committed") + ".", ""]
    lines += ["## Invariants", ""]
    lines += [f"- {'PASS' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}" for c in result["invariants"]]
    lines += ["", "## Totals", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result["totals"].items()]
    lines += ["", "## Rounds", "", "| round | seconds | outcomes | rss MiB | steps | preemptions | kv peak |",
              "|---|---|---|---|---|---|---|"]
    for r in result["rounds"]:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(r.get("outcomes", {}).items()))
        lines.append(f"| {r['round']} | {r['seconds']:.1f} | {outcomes} | {r['rss_mib']:.1f} | "
                     f"{r.get('steps', '')} | {r.get('preemptions', '')} | {r.get('kv_peak', '')} |")
    lines += ["", "## Config", "", "```json", json.dumps(result["config"], indent=2), "```", ""]
    return "\n".join(lines)


def write(result: dict[str, Any], out: str | Path) -> Path:
    d = out_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (d / "summary.md").write_text(markdown(result))
    return d


def finish(result: dict[str, Any]) -> int:
    """Print the invariants (the roll-up, and every failing line) to stderr and one JSON line to
    stdout; the exit status: 0 when every invariant held."""
    shown = [Check(c["name"], c["ok"], c["detail"]) for c in result["invariants"]
             if not c["ok"] or not c["name"].startswith("round ")]
    print_checks(shown)
    short = {k: result[k] for k in ("name", "ok", "totals")}
    short["failed"] = [c["name"] for c in result["invariants"] if not c["ok"]]
    if "written_to" in result:
        short["written_to"] = result["written_to"]
    print(json.dumps(short, default=str), flush=True)
    return 0 if result["ok"] else 1
