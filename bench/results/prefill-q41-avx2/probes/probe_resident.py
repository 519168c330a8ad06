"""B=1 decode beside K resident sequences: python probe_resident.py GGUF INV K [SWA_FULL]"""
import sys, time
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from skippy.native.batch import Batch
from skippy.native.context import Context, ContextOptions
from skippy.native.model import Model

path, inv, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
nseq = int(sys.argv[4]) if len(sys.argv) > 4 else 16
nctx = int(sys.argv[5]) if len(sys.argv) > 5 else 8192
model = Model(path, repack=inv != 1)
ctx = Context(model, ContextOptions(n_ctx=nctx, n_batch=512, n_ubatch=512, n_seq_max=nseq, threads=2, batch_invariant=inv == 1))
rng = np.random.default_rng(0)
batch = Batch(512)
def fill(seq, n, pos0=0):
    tok = rng.integers(1000, 20000, size=n).astype(np.int32)
    out = np.zeros(n, np.int8); out[-1] = 1
    batch.set(tok, np.arange(pos0, pos0 + n).astype(np.int32), np.full(n, seq, np.int32), out)
    ctx.decode(batch)
for s in range(1, k + 1):
    fill(s, 192)
res = []
for rep in range(3):
    fill(0, 128)
    ts = []
    for i in range(64):
        t = time.perf_counter(); fill(0, 1, 128 + i); ts.append(time.perf_counter() - t)
    ctx.seq_rm(0, 0, -1)
    res.append(np.median(ts))
print(f"inv={inv} nseq={nseq} nctx={nctx} resident={k}: decode p50 {1e3*np.median(res):.2f} ms ({[round(1e3*x,2) for x in res]})")
