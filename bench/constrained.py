"""In-process cost of constrained decoding (issue #21): output tokens/s with and without json_schema requests.

    python bench/constrained.py [OUT_DIR]      (default bench/results/constrained)

SmolLM2, n_ctx 8192, 2 threads. N=32 concurrent greedy requests (chat prompts of ~64 tokens, max_tokens 64).
Run A: none constrained; run B: every other request constrained by a small nested-object json_schema
(compiled once with skippy.constrain.compile_grammar). Runs interleaved A,B,A,B after a warm-up, in one
process; reports output tokens/s per run (tokens actually emitted / wall time) and the ratio B/A of the means.
Writes results.json and summary.md.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import trio

import skippy
from skippy.constrain import GrammarSpec, compile_grammar

N, MAX_TOKENS, ROUNDS = 32, 64, 2
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 16},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
TOPICS = ["a baker in Lyon", "a sailor from Oslo", "a teacher in Kyoto", "a farmer near Austin", "a nurse in Lagos",
          "a pilot from Lima", "a chemist in Graz", "a poet from Cork"]


def prompts(engine) -> list[list[int]]:
    out = []
    for i in range(N):
        text = (f"Request {i}. Describe {TOPICS[i % len(TOPICS)]} in a short answer: their name, their age, "
                "the city they live in and its postal code. Keep it brief and factual, and do not add any "
                "commentary, greetings or explanations beyond what was asked for here.")
        out.append(list(engine.chat_tokens([{"role": "user", "content": text}])))
    return out


async def run(engine, ps, grammar, constrained_every: int | None) -> dict:
    counts = [0] * len(ps)
    reasons = [None] * len(ps)

    async def one(i):
        g = grammar if constrained_every and i % constrained_every == 0 else None
        async for e in engine.generate(ps[i], {"temperature": 0.0}, max_tokens=MAX_TOKENS, grammar=g):
            counts[i] += e.token is not None
            if e.finish_reason:
                reasons[i] = e.finish_reason

    s0 = engine.stats()
    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(ps)):
            nursery.start_soon(one, i)
    wall = time.perf_counter() - t
    s1 = engine.stats()
    n_con = sum(1 for i in range(len(ps)) if constrained_every and i % constrained_every == 0)
    return {"constrained": n_con, "tokens": sum(counts), "wall_s": round(wall, 3),
            "tok_s": round(sum(counts) / wall, 2),
            "tokens_constrained": sum(c for i, c in enumerate(counts) if constrained_every and i % constrained_every == 0),
            "finish": {r: reasons.count(r) for r in set(reasons)},
            # engine-side split: time in llama decode vs the rest of the busy loop (sampling, masks, bookkeeping)
            "steps": s1.steps - s0.steps, "t_decode_s": round(s1.t_decode - s0.t_decode, 3),
            "t_busy_s": round(s1.t_busy - s0.t_busy, 3)}


async def main(out_dir: Path) -> None:
    async with skippy.open_engine("smollm2", n_ctx=8192, threads=2) as engine:
        t = time.perf_counter()
        grammar = await trio.to_thread.run_sync(compile_grammar, engine.runtime, GrammarSpec("json_schema", SCHEMA))
        compile_s = time.perf_counter() - t
        ps = prompts(engine)
        await run(engine, ps[:4], grammar, 2)  # warm-up (tokenizer bridge, first steps)
        runs = []
        for r in range(ROUNDS):
            for name, every in (("A", None), ("B", 2)):
                res = {"run": name, "round": r, **await run(engine, ps, grammar, every)}
                print(json.dumps(res), flush=True)
                runs.append(res)
    mean = {k: sum(x["tok_s"] for x in runs if x["run"] == k) / ROUNDS for k in "AB"}
    ratio = mean["B"] / mean["A"]
    result = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": "smollm2", "n_ctx": 8192, "threads": 2, "n": N, "max_tokens": MAX_TOKENS,
        "prompt_tokens_min_max": [min(map(len, ps)), max(map(len, ps))],
        "schema": SCHEMA, "compile_s": round(compile_s, 3), "runs": runs,
        "mean_tok_s": {k: round(v, 2) for k, v in mean.items()}, "ratio_B_over_A": round(ratio, 3),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "note": "2-core box shared with a concurrent full test-suite run (bench under nice -n 19): absolute "
                "figures are noisy; the interleaved A/B ratio is the figure to read.",
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = "\n".join(f"| {x['run']} | {x['round']} | {x['constrained']}/{N} | {x['tokens']} | {x['wall_s']:.2f} | "
                     f"{x['tok_s']:.1f} |" for x in runs)
    (out_dir / "summary.md").write_text(f"""# Constrained decoding overhead (issue #21)

`{result['command']}` — {result['date']}

SmolLM2-135M Q4_1, n_ctx 8192, 2 threads, N={N} concurrent greedy requests (~{len(ps[0])}-token chat
prompts, max_tokens {MAX_TOKENS}). Run A: none constrained; run B: every other request constrained by a small
nested json_schema (name/age/address{{city,zip}}; compiled once, {compile_s:.2f} s). Interleaved A,B,A,B in one
process after a warm-up. tok/s = output tokens actually emitted / wall time (most unconstrained greedy
answers end on EOS before max_tokens, so each run's token count is fixed but not N x max_tokens).

| run | round | constrained | tokens | wall s | tok/s |
|---|---|---|---|---|---|
{rows}

Mean tok/s: A {mean['A']:.1f}, B {mean['B']:.1f}; **ratio B/A = {ratio:.3f}**.

Note: {result['note']}
""")
    print(f"A {mean['A']:.1f} tok/s  B {mean['B']:.1f} tok/s  B/A {ratio:.3f}")


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "constrained")
