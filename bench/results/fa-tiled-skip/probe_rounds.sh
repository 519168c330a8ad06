# the rounds of README.md: /work/main held the tree before patch 0014, /work/wt the tree with it (built under SKIPPY_CACHE=/tmp/skc)
P=/work/wt/bench/results/fa-tiled-skip/served_ttft.py
for round in 1 2; do
  (cd /work/main && .venv/bin/python $P "patches 0001-0013 (before), round $round")
  (cd /work/wt && SKIPPY_CACHE=/tmp/skc PYTHONPATH=/work/wt .venv/bin/python $P "patches 0001-0014, round $round")
  (cd /work/main && .venv/bin/python $P "patches 0001-0013, --no-prefix-cache, round $round" -- --no-prefix-cache)
done
