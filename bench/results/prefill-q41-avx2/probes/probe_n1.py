"""N=1 embedded: per-step t_decode / t_step and token gaps. python probe_n1.py GGUF [inv]"""
import os, sys, time
import numpy as np, trio, skippy
MODEL = sys.argv[1]; INV = int(sys.argv[2]) if len(sys.argv) > 2 else 1
steps = []
async def main():
    async with skippy.open_engine(MODEL, n_ctx=12288, threads=2, batch_invariant=bool(INV),
                                  on_step=lambda r: steps.append((r.decode_tokens, r.prefill_tokens, r.t_compose, r.t_decode, r.t_sample, r.t_step))) as engine:
        rng = np.random.default_rng(0)
        gaps = []
        for i in range(8):
            prompt = rng.integers(100, 20000, 128).tolist()
            last = None
            async for ev in engine.generate(prompt, max_tokens=64, ignore_eos=True):
                now = time.perf_counter()
                if last is not None and i > 0: gaps.append(now - last)
                last = now
    a = np.array(steps); d = a[(a[:, 0] == 1) & (a[:, 1] == 0)]
    print(f"inv={INV} decode steps {len(d)}: t_compose {1e3*np.median(d[:,2]):.2f} t_decode {1e3*np.median(d[:,3]):.2f} t_sample {1e3*np.median(d[:,4]):.2f} t_step {1e3*np.median(d[:,5]):.2f} ms; token gap p50 {1e3*np.median(gaps):.2f} mean {1e3*np.mean(gaps):.2f} ms")
trio.run(main)
