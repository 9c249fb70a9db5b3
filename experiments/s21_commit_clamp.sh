#!/usr/bin/env bash
# The twenty-first session's clamp of the commits' target (docs/design.md §3, experiments/NOTES.md
# "The commits' target clamped"), on whichever card a device call gets: the shipped commits
# against the unclamped ones (kernel_variants.py c-unclamped, r-unclamped) in one process, 24
# layers a launch as the runtime commits, then the GPU suite. One call; the results in $OUT.
set -uo pipefail
ab_name=s21 ab_log=s21-commit-clamp.log
. "$(dirname "$0")/ab_session.sh"
(cd experiments && run timeout 100 $PY ab_kernels.py commit c-unclamped --layers 24 --cases 1x16,1x64,4x64,16x64,64x64 \
  --out "$OUT/ab-commit-unclamped.json")
(cd experiments && run timeout 120 $PY ab_kernels.py replay r-unclamped --layers 24 \
  --cases 1x16,16x16,16x64,64x64,64x2:chain,16x4:chain,1x64:chain,16x64:chain \
  --out "$OUT/ab-replay-unclamped.json")
[ "${SKIP_TESTS:-0}" = 1 ] || run timeout 340 $PY -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=10
