#!/usr/bin/env bash
# Device call 20 (owed by the third session): the block-merging solve for trees deeper than 8
# (commit dd027dc) on the GPU: kernel tests (now with correlated deep chains at real shapes),
# then `bole bench kernels` on chains (the run-18 chain figures predate it) and on the target
# grid (depth <= 8 keeps the product form: expected unchanged from run 18).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT/target" "$OUT/chain"
timeout 150 python3 -m pytest -q -m gpu tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -4
timeout 150 python3 -m bole_cli.cli bench kernels --batch 1,4,16,64 --nodes 16,32,64,128 --trees chain \
  --out-dir "$OUT/chain" 2>&1 | tee "$OUT/chain/bench.log" | tail -22
timeout 120 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random \
  --out-dir "$OUT/target" 2>&1 | tee "$OUT/target/bench.log" | tail -18
