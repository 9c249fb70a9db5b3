#!/usr/bin/env bash
# The twentieth session's clamp of a request's offsets to the N nodes (docs/design.md §3,
# experiments/NOTES.md "Offsets clamped to the forest"), on whichever card a device call gets:
# the shipped kernels against the unclamped ones (kernel_variants.py v-unclamped, b-unclamped)
# in one process, then the GPU suite. One call; the results in $OUT.
set -uo pipefail
ab_name=s20 ab_log=s20-clamp.log
. "$(dirname "$0")/ab_session.sh"
(cd experiments && run timeout 100 $PY ab_kernels.py verify v-unclamped --cases 1x16,1x64,4x32,16x16,16x64,64x64 \
  --out "$OUT/ab-verify-unclamped.json")
(cd experiments && run timeout 100 $PY ab_kernels.py blocked b-unclamped --cases 1x128,16x128,64x128,16x256 \
  --out "$OUT/ab-blocked-unclamped.json")
[ "${SKIP_TESTS:-0}" = 1 ] || run timeout 340 $PY -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=10
