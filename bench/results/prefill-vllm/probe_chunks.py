"""Native prefill of a 1024-token prompt in two 512-token chunks: python probe_chunks.py GGUF INV N_CTX N_SEQ"""
import sys, time
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from skippy.native.batch import Batch
from skippy.native.context import Context, ContextOptions
from skippy.native.model import Model

path, inv, n_ctx, n_seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = Model(path, repack=inv != 1)
ctx = Context(model, ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_seq_max=n_seq, threads=2, batch_invariant=inv == 1))
rng = np.random.default_rng(0)
batch = Batch(512)
res = []
for rep in range(4):
    tok = rng.integers(1000, 20000, size=1024).astype(np.int32)
    times = []
    for c in range(2):
        out = np.zeros(512, np.int8); out[-1] = 1
        batch.set(tok[c*512:(c+1)*512], np.arange(c*512, (c+1)*512).astype(np.int32), np.zeros(512, np.int32), out)
        t = time.perf_counter(); ctx.decode(batch); times.append(time.perf_counter() - t)
    ctx.seq_rm(0, 0, -1)
    res.append(times)
r = np.median(np.array(res[1:]), axis=0)
print(f"inv={inv} n_ctx={n_ctx} n_seq={n_seq}: chunk1 {1e3*r[0]:.0f} ms, chunk2 {1e3*r[1]:.0f} ms")
