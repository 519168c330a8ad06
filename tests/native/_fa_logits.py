"""Child process of test_fa_shared_pool.py: the sha256 of every logits row of 8 interleaved
sequences sharing one pool (staggered arrivals, chunked prefill, decodes mixed in).

Run once with SKIPPY_FA_SCAN_ALL=1 and once without: patch 0004 reads it once per process.
usage: _fa_logits.py MODEL_PATH INVARIANT(0|1) N_UBATCH
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

from skippy._lockstep import Seq, run
from skippy.native import Context, ContextOptions, Model


def main(path: str, invariant: bool, n_ubatch: int) -> None:
    with Model(Path(path), repack=not invariant) as model:
        opts = ContextOptions(n_ctx=8 * 256, n_batch=512, n_ubatch=n_ubatch, n_seq_max=8, threads=2,
                              batch_invariant=invariant)
        with Context(model, opts) as ctx:
            rng = np.random.default_rng(11)
            low, high = (1000, min(20000, model.n_vocab)) if model.n_vocab > 30000 else (260, model.n_vocab)
            prompts = [rng.integers(low, high, size=n).astype(np.int32) for n in rng.integers(5, 120, size=8)]
            seqs = [Seq(p, i, arrival=2 * i, chunk=16) for i, p in enumerate(prompts)]
            digest = hashlib.sha256()
            for result in run(ctx, seqs, 24):
                digest.update(np.ascontiguousarray(result.rows, dtype=np.float32).tobytes())
            print(digest.hexdigest())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]))
