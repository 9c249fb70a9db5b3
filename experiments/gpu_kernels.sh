#!/usr/bin/env bash
# One device call: GPU correctness tests at real shapes, a launch-config sweep of tree_verify,
# then `bole bench kernels`. From the repo root on the GPU machine (.whl carried):
#   bash bench/gpu_kernels.sh [sweep|nosweep] [bench args]
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bole-out}
mkdir -p "$OUT"
mode=${1:-sweep}; shift || true
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
if [ "$mode" = sweep ]; then
  timeout 240 python3 bench/sweep_verify.py "$OUT/sweep_verify.json" 2>&1 | grep -v '^skip' | tee "$OUT/sweep.log"
fi
COLUMNS=200 timeout 300 python3 -m bole_cli.cli bench kernels --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
