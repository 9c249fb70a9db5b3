#!/usr/bin/env bash
# Device call 16: verify v4/v6/v7 A/B (bench/probe_run16.py), GPU kernel tests, then
# `bole bench kernels` on the target grid (random trees) and on chains.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 150 python3 bench/probe_run16.py "$OUT/probe-run16-h200.json" 2>&1 | grep -v Warn | tee "$OUT/probe.log"
timeout 100 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -3
mkdir -p "$OUT/random" "$OUT/chain"
timeout 150 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random --out-dir "$OUT/random" 2>&1 \
  | tee "$OUT/random/bench.log" | tail -20
timeout 150 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees chain --out-dir "$OUT/chain" 2>&1 \
  | tee "$OUT/chain/bench.log" | tail -18
