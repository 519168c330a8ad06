"""Closed loop of 32 on falcon-h1 through the embedded engine: each step's shape, time and prediction."""
import json, os, sys, time
import numpy as np, trio, skippy
from skippy.scheduling.cost import StepShape

MODEL = os.path.expanduser("~/.cache/skippy/models/synth/falcon-h1-base-q4_k_m-s0-v1.gguf")
N, TOTAL, P, G = 32, int(sys.argv[1]) if len(sys.argv) > 1 else 64, 128, 64
steps = []

async def main():
    eng_box = {}
    def on_step(rep):
        e = eng_box.get("e")
        pred = None
        if e is not None:
            cost = e._policies.scheduler.slo.cost
            pred = cost.seconds(StepShape(rep.decode_tokens, rep.prefill_tokens, 0.3 * rep.decode_tokens, int(rep.prefill_tokens > 0), int(rep.prefill_tokens > 0 and rep.decode_tokens > 0)))
        steps.append((rep.decode_tokens, rep.prefill_tokens, rep.t_decode, rep.t_step, pred))
    async with skippy.open_engine(MODEL, n_ctx=12288, threads=2, on_step=on_step) as engine:
        eng_box["e"] = engine
        rng = np.random.default_rng(0)
        sent = [0]
        async def client(c):
            while sent[0] < TOTAL:
                sent[0] += 1
                prompt = rng.integers(100, 20000, P).tolist()
                async for ev in engine.generate(prompt, max_tokens=G, ignore_eos=True):
                    pass
        async with trio.open_nursery() as n:
            for c in range(N):
                n.start_soon(client, c)
        print(engine.latency_targets())
        print(engine._policies.scheduler.slo.cost.theta())
trio.run(main)
a = np.array([(d, p, td, ts, pr if pr is not None else np.nan) for d, p, td, ts, pr in steps])
json.dump(a.tolist(), open("/work/scratch/adv/steps.json", "w"))
mixed = a[(a[:, 1] > 0) & (a[:, 0] > 0)]
dec = a[(a[:, 1] == 0) & (a[:, 0] > 0)]
print("steps", len(a), "mixed", len(mixed), "decode-only", len(dec))
for name, s in (("mixed", mixed), ("decode", dec)):
    print(name, "rows p50", np.median(s[:, 0]), "prefill p50/p90/max", np.percentile(s[:, 1], [50, 90, 100]),
          "t_decode p50/p90/p99", np.percentile(s[:, 2], [50, 90, 99]).round(3), "pred p50/p90", np.nanpercentile(s[:, 4], [50, 90]).round(3))
big = mixed[mixed[:, 2] > np.percentile(mixed[:, 2], 90)]
print("slowest mixed (rows, prefill, t, pred):", big[:12, [0, 1, 2, 4]].round(3).tolist())
