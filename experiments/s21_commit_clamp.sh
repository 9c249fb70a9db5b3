#!/usr/bin/env bash
# The twenty-first session's clamp of the commits' target (docs/design.md §3, experiments/NOTES.md
# "The commits' target clamped"), on whichever card a device call gets: the shipped commits
# against the unclamped ones (kernel_variants.py c-unclamped, r-unclamped) in one process, 24
# layers a launch as the runtime commits, then the GPU suite. One call; the results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD  # ab_kernels.py runs from experiments/
PY=${PYTHON:-python3}
OUT=$(mkdir -p "${OUT:-out-s21}" && cd "${OUT:-out-s21}" && pwd)
log="$OUT/s21-commit-clamp.log"
run() { echo "+ $*" | tee -a "$log"; "$@" >>"$log" 2>&1; echo "rc=$? $(date +%T)" | tee -a "$log"; }
$PY -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" >>"$log" 2>&1
if ls .whl/py/*.whl >/dev/null 2>&1 && ! $PY -c "import optuna" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/py/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
(cd experiments && run timeout 100 $PY ab_kernels.py commit c-unclamped --layers 24 --cases 1x16,1x64,4x64,16x64,64x64 \
  --out "$OUT/ab-commit-unclamped.json")
(cd experiments && run timeout 120 $PY ab_kernels.py replay r-unclamped --layers 24 \
  --cases 1x16,16x16,16x64,64x64,64x2:chain,16x4:chain,1x64:chain,16x64:chain \
  --out "$OUT/ab-replay-unclamped.json")
[ "${SKIP_TESTS:-0}" = 1 ] || run timeout 340 $PY -m pytest -q -m gpu tests/ -p no:cacheprovider --durations=10
