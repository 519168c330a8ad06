"""Child process of test_rs_copies.py: the sha256 of every logits row of 8 sequences on a recurrent
model whose decodes go in shifting subsets, so a ubatch's state range spans cells of sequences not
in it (identity copies, dropped by patch 0016) and its reorder moves some (copies kept).

Run once with SKIPPY_RS_COPY_ALL=1 and once without: patch 0016 reads it once per process.
usage: _rs_copies_logits.py MODEL_PATH INVARIANT(0|1)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

from skippy.native import Batch, Context, ContextOptions, Model

N_SEQ, STEPS, CHUNK = 8, 48, 16


def main(path: str, invariant: bool) -> None:
    with Model(Path(path), repack=not invariant) as model:
        opts = ContextOptions(n_ctx=N_SEQ * 256, n_batch=256, n_ubatch=256, n_seq_max=N_SEQ, threads=2,
                              batch_invariant=invariant)
        with Context(model, opts) as ctx:
            rng = np.random.default_rng(5)
            low, high = (1000, min(20000, model.n_vocab)) if model.n_vocab > 30000 else (260, model.n_vocab)

            def prompt() -> list[int]:
                return rng.integers(low, high, size=int(rng.integers(8, 60))).tolist()

            prompts = [prompt() for _ in range(N_SEQ)]
            fed = [0] * N_SEQ
            last = [0] * N_SEQ  # the token each decoding sequence feeds next
            pos = [0] * N_SEQ
            batch = Batch(ctx.n_batch)
            digest = hashlib.sha256()
            for step in range(STEPS):
                if step == 24:  # a sequence ends and its id starts over: its state cell is cleared and reused
                    ctx.seq_rm(3)
                    prompts[3], fed[3], pos[3] = prompt(), 0, 0
                tokens, positions, seq_ids, outputs, owners = [], [], [], [], []
                # decodes in subsets that shift every step (first and last always in from step 8 on:
                # the range spans every cell between them)
                chosen = {s for s in range(N_SEQ) if rng.random() < 0.4} | ({0, N_SEQ - 1} if step >= 8 else set())
                for s in range(N_SEQ):
                    if step < s:  # staggered arrivals
                        continue
                    if fed[s] < len(prompts[s]):
                        part = prompts[s][fed[s] : fed[s] + CHUNK]
                        tokens += part
                        positions += range(fed[s], fed[s] + len(part))
                        seq_ids += [s] * len(part)
                        fed[s] += len(part)
                        pos[s] = fed[s]
                        done = fed[s] == len(prompts[s])
                        outputs += [0] * (len(part) - 1) + [int(done)]
                        if done:
                            owners.append(s)
                    elif s in chosen:
                        tokens.append(last[s])
                        positions.append(pos[s])
                        seq_ids.append(s)
                        outputs.append(1)
                        pos[s] += 1
                        owners.append(s)
                if not tokens:
                    continue
                logits = ctx.decode(batch.set(tokens, positions, seq_ids, outputs))
                for row, s in zip(logits, owners):
                    digest.update(np.ascontiguousarray(row, dtype=np.float32).tobytes())
                    last[s] = int(np.argmax(row))
            print(digest.hexdigest())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1")
