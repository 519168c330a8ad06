"""The options both drivers take, and the run configuration they become."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

import attrs

from .workload import ENGINE_MALFORMED, SERVER_MALFORMED, Shape


@attrs.frozen
class RunConfig:
    sessions: int = 64
    rounds: int = 3
    seed: int = 0
    model: str | None = None  # a GGUF path or a real model name; else `family`
    family: str | None = "llama"
    out: str | None = None
    threads: int = 1
    n_batch: int = 256
    n_seq_max: int = 64
    max_waiting: int | None = None  # waiting-queue bound (None: max(256, sessions), so nothing is refused)
    decode_reserve: int | None = None  # engine only: cells promised per running sequence (None: the default)
    demand_ratio: float = 4.0  # sum(prompt + max_tokens) per round / KV pool
    parity_sample: int = 8  # greedy completions compared with their solo run, per round
    prompt: tuple[int, int] = (4, 96)
    max_tokens: tuple[int, int] = (1, 48)
    arrival_spread: float = 0.5
    round_timeout: float = 120.0  # a round still unfinished then: its open requests are "hung"
    drain_timeout: float = 10.0  # after the clients are done, how long memory may take to go idle
    rss_tolerance_mib: float = 24.0
    rss_tolerance_pct: float = 5.0
    quiet: bool = False
    command: str = ""

    def shape(self, vocab: tuple[int, int], server: bool) -> Shape:
        return Shape(vocab=vocab, prompt=self.prompt, max_tokens=self.max_tokens, arrival_spread=self.arrival_spread,
                     chat_fraction=0.15 if server else 0.0,
                     malformed=SERVER_MALFORMED if server else ENGINE_MALFORMED)

    def model_path(self) -> Path:
        from skippy.models import resolve_model

        return resolve_model(self.model, None if self.model else self.family)

    @property
    def waiting_bound(self) -> int:
        return self.max_waiting if self.max_waiting is not None else max(256, self.sessions)

    @property
    def synthetic(self) -> bool:
        return self.model is None


def _pair(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--sessions", type=int, default=64, help="requests per round (N)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (RSS is compared between round 2 and the last)")
    p.add_argument("--seed", type=int, default=0)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", help="GGUF path or real model name (smollm2, gemma3)")
    where.add_argument("--family", default=None, help="tiny synthetic model of a family (default: llama)")
    p.add_argument("--out", help="write results.json + summary.md under stress/results/OUT/ (or OUT if it is a path)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n-batch", type=int, default=256)
    p.add_argument("--n-seq-max", type=int, default=64, help="ceiling on running sequences")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="waiting-queue bound (default max(256, N)); smaller: some requests get OverloadedError / 429")
    p.add_argument("--decode-reserve", type=int, default=None,
                   help="engine only: cells promised per running sequence beyond its prompt (small: more preemption)")
    p.add_argument("--demand-ratio", type=float, default=4.0,
                   help="sum(prompt + max_tokens) per round over the KV pool (4 = a pool at 25%% of demand)")
    p.add_argument("--parity-sample", type=int, default=8, help="greedy completions per round checked against solo")
    p.add_argument("--prompt", type=_pair, default=(4, 96), help="prompt length range LO,HI (tokens)")
    p.add_argument("--max-tokens", type=_pair, default=(1, 48), help="max_tokens range LO,HI")
    p.add_argument("--arrival-spread", type=float, default=0.5, help="seconds over which arrivals spread")
    p.add_argument("--round-timeout", type=float, default=120.0)
    p.add_argument("--rss-tolerance-mib", type=float, default=24.0)
    p.add_argument("--rss-tolerance-pct", type=float, default=5.0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def config_from(args: argparse.Namespace, argv: Sequence[str] | None, prog: str) -> RunConfig:
    argv = list(sys.argv[1:] if argv is None else argv)
    return RunConfig(
        sessions=args.sessions, rounds=args.rounds, seed=args.seed, model=args.model,
        family=None if args.model else (args.family or "llama"), out=args.out, threads=args.threads,
        n_batch=args.n_batch, n_seq_max=args.n_seq_max, decode_reserve=args.decode_reserve,
        max_waiting=args.max_waiting, demand_ratio=args.demand_ratio,
        parity_sample=args.parity_sample, prompt=args.prompt, max_tokens=args.max_tokens,
        arrival_spread=args.arrival_spread, round_timeout=args.round_timeout,
        rss_tolerance_mib=args.rss_tolerance_mib, rss_tolerance_pct=args.rss_tolerance_pct, quiet=args.quiet,
        command=shlex.join(["python", "-m", prog, *argv]),
    )


def as_dict(cfg: RunConfig) -> dict[str, Any]:
    return attrs.asdict(cfg)


def vocab_range(cfg: RunConfig, n_vocab: int) -> tuple[int, int]:
    """Prompt token ids: clear of the special and byte tokens at the low end of the vocabulary."""
    return (260, n_vocab) if cfg.synthetic else (1000, min(20000, n_vocab))
