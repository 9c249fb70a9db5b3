#!/usr/bin/env bash
# Device call 7: GPU kernel tests (one-tile verify v4, commit c4), then the v4/c4 config grid.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 170 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -6
timeout 380 python3 bench/sweep_v4.py "$OUT/sweep-v4-h200.json" 2>&1 | tee "$OUT/sweep.log" | tail -40
