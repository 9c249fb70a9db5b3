#!/usr/bin/env bash
# Device call 18 (final): GPU kernel tests, `bole bench kernels` on the target grid (random
# trees) with the shipped kernels (verify v7, commit c7) and the merged table, then the full grid.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT/target" "$OUT/full"
timeout 100 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -3
timeout 120 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random --out-dir "$OUT/target" 2>&1 \
  | tee "$OUT/target/bench.log" | tail -18
timeout 280 python3 -m bole_cli.cli bench kernels --out-dir "$OUT/full" 2>&1 | tee "$OUT/full/bench.log" | tail -50
