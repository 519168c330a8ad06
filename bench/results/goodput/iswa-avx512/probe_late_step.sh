#!/bin/bash
# The late-step probe behind NOTES.md: skippy serving gemma3 under the scaled targets, 40 requests at
# once (probe_burst.py), with slo.LATE_STEP_TTFTS at 0.1 (the default), 0.3 and 1.0, two interleaved
# rounds. Run from the repository root; prints the burst's duration and output tok/s per setting.
here=$(dirname "$0")
for round in 1 2; do for late in 0.1 0.3 1.0; do
  .venv/bin/python -c "import sys, skippy.scheduling.slo as slo; slo.LATE_STEP_TTFTS = $late
from skippy.cli import main; sys.exit(main(sys.argv[1:]))" serve --model gemma3 --host 127.0.0.1 --port 18081 \
      --threads 2 --n-ctx 12288 --n-batch 512 --ttft-slo-ms 2091.9 --tpot-slo-ms 69.5 --scheduler batched \
      > /dev/null 2>&1 &
  pid=$!
  for i in $(seq 60); do curl -sf localhost:18081/v1/completions \
      -d '{"model":"gemma3","prompt":"hi","max_tokens":2}' > /dev/null && break; sleep 1; done
  echo "round $round late $late: $(.venv/bin/python "$here/probe_burst.py" 40 18081 | tail -1)"
  kill $pid; wait $pid 2>/dev/null
done; done
