# Sourced by the one-call kernel A/B scripts (s20_clamp.sh, s21_commit_clamp.sh,
# s22_accepted_width.sh): the repository root as working folder and on PYTHONPATH (ab_kernels.py
# runs from experiments/), $PY, $OUT
# (absolute; default out-$ab_name), $log (under $OUT, named $ab_log), run (a command logged with
# its exit code and time), the versions and card first in the log, and Optuna from .whl/py for the
# GPU suite's tuning test (the device has no network). Set ab_name and ab_log before sourcing.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD
PY=${PYTHON:-python3}
OUT=$(mkdir -p "${OUT:-out-$ab_name}" && cd "${OUT:-out-$ab_name}" && pwd)
log="$OUT/$ab_log"
run() { echo "+ $*" | tee -a "$log"; "$@" >>"$log" 2>&1; echo "rc=$? $(date +%T)" | tee -a "$log"; }
$PY -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" >>"$log" 2>&1
if ls .whl/py/*.whl >/dev/null 2>&1 && ! $PY -c "import optuna" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/py/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
