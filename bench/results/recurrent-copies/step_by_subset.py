"""Decode-step time on falcon-h1 base with 32 sequences holding state, by which subset decodes."""
import sys, time, numpy as np
from pathlib import Path
from skippy.native import Batch, Context, ContextOptions, Model
M = Path(sys.argv[1]).expanduser()
with Model(M, repack=False) as model:
    opts = ContextOptions(n_ctx=12288, n_batch=512, n_ubatch=512, n_seq_max=64, threads=2, batch_invariant=True)
    with Context(model, opts) as ctx:
        rng = np.random.default_rng(0); batch = Batch(512)
        pos = {}
        for s in range(32):
            p = rng.integers(100, 20000, size=128).tolist()
            ctx.decode(batch.set(p, list(range(128)), [s] * 128, [0] * 127 + [1])); pos[s] = 128
        def step(seqs):
            t = time.perf_counter()
            ctx.decode(batch.set([5] * len(seqs), [pos[s] for s in seqs], list(seqs), [1] * len(seqs)))
            for s in seqs: pos[s] += 1
            return time.perf_counter() - t
        cases = {"all32": list(range(32)), "first6": list(range(6)), "spread6": [0, 6, 12, 18, 24, 31],
                 "pair_0_31": [0, 31], "one": [17], "alternate": None}
        for name, seqs in cases.items():
            ts = []
            for i in range(20):
                ss = seqs if seqs is not None else ([0, 1, 2, 3, 4, 5] if i % 2 else [0, 2, 4, 31, 7, 9])
                ts.append(step(ss))
            print(f"{name:10s} median {1e3*np.median(ts):7.2f} ms")
