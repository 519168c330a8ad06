"""Closed loop: N clients, R requests in all (128 in / 64 out), on the embedded engine; per-request and per-step logs."""
import sys, time, trio, numpy as np, json
from skippy.engine import open_engine
import os, skippy.runtime as _rt
if os.environ.get("SPLIT") == "0":  # the A/B: the step plan as if batches were never split
    _init = _rt.ContextRuntime.__init__
    def _patched(self, *a, **k):
        _init(self, *a, **k); self.equal_split = False
    _rt.ContextRuntime.__init__ = _patched
MODEL, N, R, TTFT, TPOT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
out = sys.argv[6]
steps = []
def on_step(r): steps.append((time.perf_counter(), r.decode_tokens, r.prefill_tokens, r.t_step, r.running, r.waiting, r.decode_ids, r.prefill_ids))
async def main():
    async with open_engine(MODEL, n_ctx=12288, threads=2, ttft_slo_ms=TTFT, tpot_slo_ms=TPOT, on_step=on_step,
                           prefix_cache=False) as eng:
        res = []; counter = iter(range(R))
        async def client():
            for i in counter:
                rng = np.random.default_rng(i)
                prompt = rng.integers(100, 20000, size=128).tolist()
                t0 = time.perf_counter(); ts = []
                async with eng.generate(prompt, {"temperature": 0}, max_tokens=64, ignore_eos=True) as s:
                    async for ev in s:
                        ts.append(time.perf_counter())
                res.append((i, t0, ts))
        t0 = time.perf_counter(); steps.clear()
        async with trio.open_nursery() as n:
            for _ in range(N):
                n.start_soon(client)
        dur = time.perf_counter() - t0
        theta = (eng._policies.scheduler.slo.cost.theta() * 1e3).round(2).tolist()
    met = 0
    for i, s, ts in res:
        ttft = ts[0] - s; tpot = (ts[-1] - ts[0]) / (len(ts) - 1)
        met += ttft <= TTFT / 1e3 and tpot <= TPOT / 1e3
    print(f"N={N} R={R} dur {dur:.1f} s tok/s {R*64/dur:.1f} met {met} goodput {met/dur:.3f} theta {theta}")
    json.dump({"t0": t0, "res": res, "steps": [list(s[:6]) + [list(s[6]), list(s[7])] for s in steps]}, open(out, "w"))
trio.run(main)
