"""`skippy demo`: N concurrent, staggered sessions through one engine, with a live progress bar.

Ends with one JSON line (the numbers the scheduler issue's Done-when asks for).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import trio

from .kv import ComponentKind

TOPICS = [
    "a lighthouse keeper who finds a message in a bottle", "the first city on Mars", "a cat who learns to code",
    "an old clockmaker and a broken watch", "a storm at sea", "the last library on earth", "a dragon afraid of fire",
    "two robots playing chess", "a garden that grows at night", "a detective in a snowy village",
    "the history of bread", "how bees talk to each other", "a train that never stops", "a violin made of glass",
    "a child who can speak to trees", "the moon's secret twin", "a baker's impossible cake", "a map with no edges",
    "a forgotten island festival", "why the sky is blue",
]


SYSTEM = ("You are a storyteller for a small radio station. Every story you tell is gentle, vivid and short, "
          "with a clear beginning, middle and end, and it never repeats a story told before. ")


def shared_prefix(engine, n_tokens: int):
    """Exactly n_tokens of a system prompt (repeated as needed), starting with the model's BOS.

    `engine`: anything with `tokenize(text, add_special=True)` (an Engine, a pipeline's engine)."""
    import numpy as np

    text = SYSTEM
    while True:
        tokens = engine.tokenize(text)
        if tokens.size >= n_tokens:
            return np.asarray(tokens[:n_tokens], dtype=np.int32)
        text += SYSTEM


def prompt_for(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    lead = " It was a quiet morning." * (i // len(TOPICS))
    return f"Here is a short story about {topic}.{lead} Once upon a time,"


async def run_demo(
    model: Any = None, *, sessions: int, max_tokens: int, stagger_steps: int = 1, progress: bool = True,
    shared_prefix_tokens: int = 0, **config: Any
) -> dict[str, Any]:
    from tqdm import tqdm

    from .engine import open_engine

    outcome = {"completed": 0, "failed": 0}
    bar = tqdm(total=sessions * max_tokens, unit="tok", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    async with open_engine(model, **config) as engine:
        system = shared_prefix(engine, shared_prefix_tokens) if shared_prefix_tokens else None

        def prompt(i: int):
            if system is None:
                return prompt_for(i)
            import numpy as np

            return np.concatenate([system, engine.tokenize(" " + prompt_for(i), add_special=False)])

        # staggered in steps, not seconds: session i arrives stagger_steps step starts after session i-1
        # was queued, so arrivals land while others decode whatever the machine's speed (polling the
        # step count every 2 ms missed whole sessions on a fast box: they all arrived after the first
        # had finished, and no step mixed prefill with decode)
        queued = [trio.Event() for _ in range(sessions)]

        async def next_step_start() -> None:
            started = trio.Event()
            engine.after_next_step_start(started.set)
            await started.wait()

        async def session(i: int) -> None:
            if i:
                await queued[i - 1].wait()
                for _ in range(stagger_steps):
                    await next_step_start()
            try:
                stream = engine.generate(prompt(i), max_tokens=max_tokens)
                await stream.queued()
                queued[i].set()
                async for event in stream:
                    if event.token is not None:
                        bar.update(1)
                    if event.final:
                        ok = event.finish_reason in ("stop", "length")
                        outcome["completed" if ok else "failed"] += 1
                        if not ok:
                            print(f"session {i}: {event.finish_reason} {event.error}", file=sys.stderr)
            except Exception as exc:  # a rejected session is a failure of the demo, never a crash
                outcome["failed"] += 1
                print(f"session {i}: {exc!r}", file=sys.stderr)
            finally:
                queued[i].set()
            s = engine.stats()
            bar.set_postfix(running=s.running, waiting=s.waiting, steps=s.steps, done=outcome["completed"])

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(session, i)

            async def ticker() -> None:
                while True:
                    await trio.sleep(0.25)
                    s = engine.stats()
                    bar.set_postfix(running=s.running, waiting=s.waiting, steps=s.steps, done=outcome["completed"])

            ticker_scope = trio.CancelScope()

            async def tick() -> None:
                with ticker_scope:
                    await ticker()

            nursery.start_soon(tick)
            while outcome["completed"] + outcome["failed"] < sessions:
                await trio.sleep(0.05)
            ticker_scope.cancel()
        elapsed = time.perf_counter() - started
        stats = engine.stats()
    bar.close()
    return {
        "completed": outcome["completed"],
        "failed": outcome["failed"],
        "max_running": stats.max_running,
        "steps": stats.steps,
        "mixed_steps": stats.mixed_steps,
        "preemptions": stats.preemptions,
        "out_tok_per_s": round(stats.output_tokens / elapsed, 1) if elapsed else 0.0,
        "step_overhead_pct": round(stats.step_overhead_pct, 2),
        "prefix_hit_tokens": stats.prefix_hits,
        "prefill_tokens": stats.prefill_tokens,
        "kv_cells_peak": stats.kv_used_peak.get(ComponentKind.ATTN, 0),
        # the latency targets the steps were planned for (scheduling.slo) and how many finished within both
        "tpot_slo_ms": None if stats.slo_tpot_s is None else round(1e3 * stats.slo_tpot_s, 1),
        "slo_met": stats.slo_met,
        "slo_missed": stats.slo_missed,
    }


def main(model: Any, sessions: int, max_tokens: int, progress: bool = True, shared_prefix_tokens: int = 0,
         **config: Any) -> dict[str, Any]:
    result = trio.run(lambda: run_demo(model, sessions=sessions, max_tokens=max_tokens, progress=progress,
                                       shared_prefix_tokens=shared_prefix_tokens, **config))
    print(json.dumps(result), flush=True)
    return result
