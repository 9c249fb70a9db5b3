#!/usr/bin/env bash
# Device call 3: all GPU-marked tests, the tree_verify variant sweep, a measured 9B calibration.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
timeout 220 python3 bench/sweep_verify.py "$OUT/sweep_variants.json" 2>&1 | grep -v '^skip' | tee "$OUT/sweep.log"
timeout -s INT 190 python3 -m bole_cli.cli calibrate --gpu h200 --model 9b --measure --batch 1,4,8,16 \
  --kv 1024,8192 --grid 16,32,64,128,256,512 --repeats 5 --out "$OUT/Qwen3.5-9B.yaml" 2>&1 | tail -30 | tee "$OUT/calibrate.log"
