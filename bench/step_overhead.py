"""In-process N=1 per-token cost: ms per token, decode ms per step and the engine's overhead figure.

    python bench/step_overhead.py fast|inv OVERLAP(0|1) N_CTX PREFIX(0|1) [N_SEQ_MAX]

SmolLM2, 2 threads, 128-token prompt, 3 x 256 greedy tokens after a warm-up; the figures quoted
in bench/results/token-latency/README.md (overlap on/off, pool 4096 vs 16384) come from this.
"""
import sys, time, trio, skippy
inv = sys.argv[1] == "inv"; ov = sys.argv[2] == "1"
async def main():
    async with skippy.open_engine("smollm2", n_ctx=int(sys.argv[3]), threads=2, batch_invariant=inv, overlap_steps=ov, prefix_cache=sys.argv[4] == "1", n_seq_max=(int(sys.argv[5]) if len(sys.argv) > 5 else None)) as engine:
        prompt = list(range(100, 228))
        async for _ in engine.generate(prompt, max_tokens=8, ignore_eos=True): pass
        s0 = engine.stats(); t = time.perf_counter(); n = 0
        for _ in range(3):
            async for e in engine.generate(prompt, max_tokens=256, ignore_eos=True):
                n += e.token is not None
        wall = time.perf_counter() - t; s = engine.stats()
        dec = s.t_decode - s0.t_decode; steps = s.steps - s0.steps
        print(f"inv={inv} overlap={ov} ms/token={1e3*wall/n:.3f} decode ms/step={1e3*dec/steps:.3f} overhead%={100*((s.t_busy-s0.t_busy)-(s.t_busy_decode-s0.t_busy_decode))/(s.t_busy-s0.t_busy):.2f}")
trio.run(main)
