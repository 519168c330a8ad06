#!/bin/bash
M=~/.cache/skippy/models/synth/falcon-h1-base-q4_k_m-s0-v1.gguf
for round in 1 2; do for split in 0 1; do
  echo "round $round split=$split: $(SPLIT=$split timeout 400 .venv/bin/python bench/results/recurrent-splits/closed_loop.py $M ${N:-32} ${R:-64} 2893.2 50.3 /tmp/ab-$round-$split.json 2>/dev/null | tail -1)"
done; done
