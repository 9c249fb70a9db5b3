#!/usr/bin/env bash
# The twenty-second session's accepted node compared at its own width (docs/design.md §3,
# experiments/NOTES.md "Accepted compared at its width"), on whichever card a device call gets:
# the shipped commits against the ones that truncate accepted to int32 first (kernel_variants.py
# c-wrapping, r-wrapping) in one process, 24 layers a launch, with accepted int64 (the runtime's)
# and int32 (SGLang's), then the GPU suite. One call; the results in $OUT.
set -uo pipefail
ab_name=s22 ab_log=s22-accepted-width.log
. "$(dirname "$0")/ab_session.sh"
for dt in int64 int32; do
  (cd experiments && run timeout 100 $PY ab_kernels.py commit c-wrapping --layers 24 --accepted $dt \
    --cases 1x16,1x64,4x64,16x64,64x64 --out "$OUT/ab-commit-wrapping-$dt.json")
  (cd experiments && run timeout 120 $PY ab_kernels.py replay r-wrapping --layers 24 --accepted $dt \
    --cases 1x16,16x16,16x64,64x64,64x2:chain,16x4:chain,1x64:chain,16x64:chain \
    --out "$OUT/ab-replay-wrapping-$dt.json")
done
[ "${SKIP_TESTS:-0}" = 1 ] || run timeout 340 $PY -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=10
