"""The seeded request mix of a stress run (pure: no I/O, no trio).

A round is N jobs. Each job says what its client will do (complete, cancel, disconnect,
time out, or send something malformed), with a random prompt, max_tokens, priority,
sampling and arrival time. The KV pool is sized from the demand of the well-formed jobs, so
that sum(prompt + max_tokens) over a round is `demand_ratio` times the pool: the scheduler
has to queue, evict and preempt, never just run everything at once.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

import attrs
import numpy as np

# What a client does with its request. "malformed" never reaches the scheduler.
KINDS = ("complete", "cancel", "disconnect", "timeout", "malformed")
DEFAULT_MIX = {"complete": 0.56, "cancel": 0.12, "disconnect": 0.10, "timeout": 0.10, "malformed": 0.12}
PRIORITIES = (-1, 0, 0, 0, 1, 2, 5)  # mostly default, a few higher and one lower class

# Malformed inputs. The engine raises a named InvalidInputError from generate(); the server
# answers a 4xx with OpenAI's JSON error body (404 only for an unknown model).
ENGINE_MALFORMED = ("prompt_too_long", "zero_max_tokens", "empty_prompt", "token_out_of_vocab", "bad_priority",
                    "negative_temperature", "negative_seed", "bad_stop")
SERVER_MALFORMED = ("bad_json", "not_an_object", "wrong_type_max_tokens", "wrong_type_prompt", "unsupported_field",
                    "prompt_too_long", "negative_seed", "n_gt_1", "empty_prompt", "unknown_model",
                    "temperature_out_of_range", "token_out_of_vocab", "bad_priority", "missing_messages")


@attrs.frozen
class Shape:
    """Ranges a workload draws from; `vocab` is the half-open token-id range of random prompts."""

    vocab: tuple[int, int]
    prompt: tuple[int, int] = (4, 96)  # prompt tokens, inclusive
    max_tokens: tuple[int, int] = (1, 48)
    shared_prefixes: int = 3  # system prompts some jobs start with (exercises the prefix cache)
    shared_prefix_len: int = 32
    shared_fraction: float = 0.3
    greedy_fraction: float = 0.5  # the rest sample with a seed
    chat_fraction: float = 0.0  # server only: chat completions instead of completions
    stream_fraction: float = 0.5  # server only: SSE for "complete" jobs
    arrival_spread: float = 0.5  # seconds over which the non-burst jobs arrive
    burst_fraction: float = 0.4  # arrive at t=0
    timeout_range: tuple[float, float] = (0.01, 0.5)  # client deadlines, seconds
    mix: tuple[tuple[str, float], ...] = tuple(DEFAULT_MIX.items())
    malformed: tuple[str, ...] = ENGINE_MALFORMED


@attrs.frozen
class Job:
    """One client's request and what it will do with it."""

    id: str  # "r{round}-{i}": unique within a run
    kind: str
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int = 0
    greedy: bool = True
    seed: int | None = None
    arrival_s: float = 0.0
    cut_after: int = 0  # cancel / disconnect after this many tokens (0: before the first)
    timeout_s: float = 0.0
    stream: bool = True
    chat: bool = False
    drop: bool = False  # engine disconnect: drop the stream (garbage) instead of aclose()
    malformed: str | None = None

    @property
    def demand(self) -> int:
        """Cells the request can occupy at its longest."""
        return 0 if self.kind == "malformed" else len(self.prompt) + self.max_tokens

    @property
    def sampling(self) -> dict[str, Any]:
        return {} if self.greedy else {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": self.seed}


def make_round(shape: Shape, n: int, seed: int, round_no: int, prefixes: Sequence[Sequence[int]] = ()) -> list[Job]:
    """N jobs for one round; the same (shape, n, seed, round_no, prefixes) gives the same jobs."""
    rng = np.random.default_rng([seed, round_no])
    kinds, weights = zip(*shape.mix)
    p = np.asarray(weights, dtype=float) / sum(weights)
    jobs = []
    for i in range(n):
        kind = str(rng.choice(kinds, p=p))
        n_prompt = int(rng.integers(shape.prompt[0], shape.prompt[1] + 1))
        prompt = rng.integers(*shape.vocab, size=n_prompt).tolist()
        if prefixes and rng.random() < shape.shared_fraction:
            prompt = list(prefixes[int(rng.integers(len(prefixes)))]) + prompt[: max(1, n_prompt - shape.shared_prefix_len)]
        max_tokens = int(rng.integers(shape.max_tokens[0], shape.max_tokens[1] + 1))
        greedy = bool(rng.random() < shape.greedy_fraction)
        arrival = 0.0 if rng.random() < shape.burst_fraction else float(rng.uniform(0, shape.arrival_spread))
        jobs.append(Job(
            id=f"r{round_no}-{i}",
            kind=kind,
            prompt=tuple(int(t) for t in prompt),
            max_tokens=max_tokens,
            priority=int(rng.choice(PRIORITIES)),
            greedy=greedy,
            seed=None if greedy else int(rng.integers(0, 2**31)),
            arrival_s=arrival,
            cut_after=int(rng.integers(0, max_tokens)),
            timeout_s=float(rng.uniform(*shape.timeout_range)),
            stream=bool(rng.random() < shape.stream_fraction),
            chat=bool(rng.random() < shape.chat_fraction),
            drop=bool(rng.random() < 0.5),
            malformed=str(rng.choice(shape.malformed)) if kind == "malformed" else None,
        ))
    return jobs


def shared_prefixes(shape: Shape, seed: int) -> list[list[int]]:
    """The run's system prompts (the same in every round, so later rounds hit resident entries)."""
    rng = np.random.default_rng([seed, 10**6])
    return [rng.integers(*shape.vocab, size=shape.shared_prefix_len).tolist() for _ in range(shape.shared_prefixes)]


def demand(jobs: Sequence[Job]) -> int:
    """Sum over the well-formed jobs of prompt + max_tokens: the cells they could hold at once."""
    return sum(j.demand for j in jobs)


def pool_cells(rounds: Sequence[Sequence[Job]], demand_ratio: float = 4.0, align: int = 256) -> int:
    """The KV pool (n_ctx) for a run: mean demand per round / demand_ratio, rounded up to `align`
    (llama.cpp pads the context to 256 cells anyway), never below twice the longest job
    (every request must fit on its own, with room for a second one)."""
    mean = sum(demand(r) for r in rounds) / max(1, len(rounds))
    longest = max((j.demand for r in rounds for j in r), default=1)
    cells = max(math.ceil(mean / demand_ratio), 2 * longest)
    return int(math.ceil(cells / align) * align)


# -- malformed inputs ---------------------------------------------------------------------


def engine_malformed(job: Job, n_ctx: int, n_vocab: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) for engine.generate() that must raise a named InvalidInputError."""
    prompt, kw = list(job.prompt), {"max_tokens": job.max_tokens}
    match job.malformed:
        case "prompt_too_long":
            prompt = (prompt * (n_ctx // len(prompt) + 1))[:n_ctx]
        case "zero_max_tokens":
            kw["max_tokens"] = 0
        case "empty_prompt":
            prompt = []
        case "token_out_of_vocab":
            prompt = prompt + [n_vocab + 7]
        case "bad_priority":
            kw["priority"] = "high"
        case "negative_temperature":
            kw["sampling"] = {"temperature": -1.0}
        case "negative_seed":
            kw["sampling"] = {"temperature": 0.5, "seed": -3}
        case "bad_stop":
            kw["stop"] = [1, 2]
        case other:
            raise ValueError(f"unknown engine malformation {other!r}")
    return (prompt,), kw


def server_malformed(job: Job, model: str, n_ctx: int, n_vocab: int) -> tuple[str, bytes, int]:
    """(path, raw body, expected status) of a request the server must refuse with a JSON error."""
    body: dict[str, Any] = {"model": model, "prompt": list(job.prompt), "max_tokens": job.max_tokens}
    path, status = "/v1/completions", 400
    match job.malformed:
        case "bad_json":
            return path, b'{"model": "' + model.encode() + b'", "prompt": [1, 2', 400
        case "not_an_object":
            return path, b"[1, 2, 3]", 400
        case "wrong_type_max_tokens":
            body["max_tokens"] = "ten"
        case "wrong_type_prompt":
            body["prompt"] = 12
        case "unsupported_field":  # unknown fields are ignored (as vLLM does); a known one at a value we lack is not
            body["best_of"] = 2
        case "prompt_too_long":
            body["prompt"] = (list(job.prompt) * (n_ctx // len(job.prompt) + 1))[:n_ctx]
        case "negative_seed":
            body["seed"] = -2  # -1 means "no seed"
        case "n_gt_1":  # n > 1 is served (forks); past the limit it is not
            body["n"] = 10_000
        case "empty_prompt":
            body["prompt"] = ""
        case "unknown_model":
            body["model"] = model + "-does-not-exist"
            status = 404
        case "temperature_out_of_range":
            body["temperature"] = 7
        case "token_out_of_vocab":
            body["prompt"] = list(job.prompt) + [n_vocab + 7]
        case "bad_priority":
            body["priority"] = "high"
        case "missing_messages":
            path, body = "/v1/chat/completions", {"model": model, "max_tokens": 4}
        case other:
            raise ValueError(f"unknown server malformation {other!r}")
    return path, json.dumps(body).encode(), status
