"""The goodput issue's done-when as checks over a bench/goodput.py result (goodput.json). Pure.

Per SLO (scaled, fixed), with skippy told the SLO it is scored on:
  goodput@<f>x        skippy's goodput >= each other engine's at every offered rate
  lead@<f>x           on dense, at 1.0-1.2x capacity, >= LEAD x the best other engine's
  SLO capacity        skippy's >= CAPACITY_VS_PEER x llama-server's on dense (>= 1x elsewhere), >= 1x the others'
  no collapse         skippy's goodput at the top rate (1.5x) >= NO_COLLAPSE x its own at 1.0x;
                      with --shed-late (skippy-shed) >= NO_COLLAPSE_SHED x
  no failures         skippy failed no request at any rate (shed ones are refusals, counted apart)
  p99 TTFT@<f>x       at every rate <= 1.0x capacity, skippy's p99 TTFT <= 1.0x each llama-server's
                      (the gate issue's ruling on open-loop Poisson; past capacity only goodput counts)
  goodput@N=<n>       closed loop: skippy's goodput >= each other engine's at every N it ran
A check whose figures are missing fails, as in the gate: absent evidence never passes.
"""

from __future__ import annotations

from typing import Any

from .gate import Check

LEAD = 1.2
CAPACITY_VS_PEER = {True: 1.3, False: 1.0}  # (dense, other classes)
NO_COLLAPSE, NO_COLLAPSE_SHED = 0.8, 0.9
LLAMA_SERVERS = ("llama-server", "llama-server-stock")
TTFT_UP_TO = 1.0  # the p99 TTFT rule holds at offered rates up to this x capacity


def _cell(table: dict[str, Any], rate: str, engine: str, slo: str) -> dict[str, Any] | None:
    return table["rates"].get(rate, {}).get(engine, {}).get(slo)


def _fraction(table: dict[str, Any], rate: str) -> float:
    return float(rate) / table["capacity_req_s"]


def goodput_checks(table: dict[str, Any], dense: bool = True) -> list[Check]:
    checks: list[Check] = []
    rates = sorted(table["rates"], key=float)
    others = sorted({e for row in table["rates"].values() for e in row if not e.startswith("skippy")})
    for slo in table["slos"]:
        for rate in rates:
            f = _fraction(table, rate)
            mine = _cell(table, rate, "skippy", slo)
            good = mine and mine["goodput"]
            best = None
            for ref in others:
                theirs = _cell(table, rate, ref, slo)
                ref_good = theirs and theirs["goodput"]
                ok = good is not None and ref_good is not None and good >= ref_good
                checks.append(Check(ref, slo, f"goodput@{f:.2g}x", ok, good, ref_good, ">= 1x"))
                if ref_good is not None:
                    best = ref_good if best is None else max(best, ref_good)
            if dense and 1.0 <= round(f, 2) <= 1.2:
                ok = good is not None and best is not None and good >= LEAD * best
                checks.append(Check("best other", slo, f"lead@{f:.2g}x", ok, good, best, f">= {LEAD}x"))
            if mine is not None:
                checks.append(Check("-", slo, f"no failures@{f:.2g}x", mine["failed"] == 0, mine["failed"], 0, "0"))
            if round(f, 2) <= TTFT_UP_TO:
                checks += _ttft_checks(table, rate, f, slo, others)
        caps = table["slo_capacity"]
        for ref in others:
            need = CAPACITY_VS_PEER[dense] if ref == "llama-server" else 1.0
            new, old = caps.get("skippy", {}).get(slo), caps.get(ref, {}).get(slo)
            ok = new is not None and old is not None and new >= need * old
            checks.append(Check(ref, slo, "SLO capacity", ok, new, old, f">= {need}x"))
        at_1 = next((r for r in rates if abs(_fraction(table, r) - 1.0) < 0.01), None)
        top = rates[-1] if rates else None
        for engine, need in (("skippy", NO_COLLAPSE), ("skippy-shed", NO_COLLAPSE_SHED)):
            base = at_1 and _cell(table, at_1, "skippy", slo)
            high = top and _cell(table, top, engine, slo)
            if engine == "skippy-shed" and high is None:
                continue  # no shed run: nothing to judge
            ok = bool(base and high) and high["goodput"] >= need * base["goodput"]
            checks.append(Check("skippy@1x", slo, f"no collapse ({engine})", ok, high and high["goodput"],
                                base and base["goodput"], f">= {need}x"))
        checks += _closed_checks(table, slo)
    return checks


def _closed_checks(table: dict[str, Any], slo: str) -> list[Check]:
    """skippy >= each other engine at every closed-loop N; a table with no closed loop fails one check."""
    closed = table.get("closed")
    if not closed:
        return [Check("-", slo, "goodput@N (closed loop)", False, None, None, "closed-loop runs")]
    out = []
    for label, row in closed.items():
        mine = row.get("skippy", {}).get(slo)
        good = mine and mine["goodput"]
        for ref in sorted(e for e in row if not e.startswith("skippy")):
            theirs = row[ref].get(slo)
            ref_good = theirs and theirs["goodput"]
            ok = good is not None and ref_good is not None and good >= ref_good
            out.append(Check(ref, slo, f"goodput@{label}", ok, good, ref_good, ">= 1x"))
    return out


def _ttft_checks(table: dict[str, Any], rate: str, f: float, slo: str, others: list[str]) -> list[Check]:
    """skippy's p99 TTFT <= each llama-server's at one rate; a missing figure fails."""
    mine = _cell(table, rate, "skippy", slo)
    new = mine and mine.get("ttft_p99_ms")
    out = []
    for ref in (e for e in others if e in LLAMA_SERVERS):
        theirs = _cell(table, rate, ref, slo)
        old = theirs and theirs.get("ttft_p99_ms")
        ok = new is not None and old is not None and new <= old
        out.append(Check(ref, slo, f"p99 TTFT@{f:.2g}x", ok, new, old, "p99 TTFT ms <= 1x (Poisson, <= 1.0x capacity)"))
    return out
