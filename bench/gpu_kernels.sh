#!/usr/bin/env bash
# One device call: GPU correctness tests at real shapes, then `bole bench kernels`.
# Usage on the GPU machine (from the repo root, .whl carried): bash bench/gpu_kernels.sh [bench args]
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bole-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_kernels.py 2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
timeout 330 python3 -m bole_cli.cli bench kernels --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
