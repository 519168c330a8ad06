#!/bin/bash
cd /work/main
for tag in before after before2 after2; do
  case $tag in after*) export SKIPPY_LLAMA_DEV_TREE=/work/scratch/dev;; *) unset SKIPPY_LLAMA_DEV_TREE;; esac
  .venv/bin/python bench/batch_invariance.py --models gemma3 falcon-h1 --batches 8 16 --rounds 2 --out /work/scratch/kbench/$tag > /work/scratch/kbench/$tag.log 2>&1
done
echo DONE
