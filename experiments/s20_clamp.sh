#!/usr/bin/env bash
# The twentieth session's clamp of a request's offsets to the N nodes (docs/design.md §3,
# experiments/NOTES.md "Offsets clamped to the forest"), on whichever card a device call gets:
# the shipped kernels against the unclamped ones (kernel_variants.py v-unclamped, b-unclamped)
# in one process, then the GPU suite. One call; the results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD  # ab_kernels.py runs from experiments/
PY=${PYTHON:-python3}
OUT=$(mkdir -p "${OUT:-out-s20}" && cd "${OUT:-out-s20}" && pwd)
log="$OUT/s20-clamp.log"
run() { echo "+ $*" | tee -a "$log"; "$@" >>"$log" 2>&1; echo "rc=$? $(date +%T)" | tee -a "$log"; }
$PY -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" >>"$log" 2>&1
if ls .whl/py/*.whl >/dev/null 2>&1 && ! $PY -c "import optuna" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/py/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
(cd experiments && run timeout 100 $PY ab_kernels.py verify v-unclamped --cases 1x16,1x64,4x32,16x16,16x64,64x64 \
  --out "$OUT/ab-verify-unclamped.json")
(cd experiments && run timeout 100 $PY ab_kernels.py blocked b-unclamped --cases 1x128,16x128,64x128,16x256 \
  --out "$OUT/ab-blocked-unclamped.json")
[ "${SKIP_TESTS:-0}" = 1 ] || run timeout 340 $PY -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=10
