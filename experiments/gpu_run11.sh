#!/usr/bin/env bash
# Device call 11: GRAM16 A/B, `bole bench kernels` on the target grid, GPU kernel tests.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 120 python3 bench/ab_gram16.py "$OUT/ab-gram16-h200.json" 2>&1 | tail -16
timeout 110 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random --out-dir "$OUT" 2>&1 \
  | tee "$OUT/bench.log" | tail -16
timeout 100 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -3
