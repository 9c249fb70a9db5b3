#!/usr/bin/env bash
# Device call 22 (fourth session): commit c7 / c8 / c8p A/B (bench/probe_run22.py), the GPU
# kernel tests with c8 shipped, and `bole bench kernels` on chains (owed since dd027dc).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT/chain"
timeout 150 python3 bench/probe_run22.py "$OUT/probe-run22-h200.json" 2>&1 | grep -v Warning | tail -24
timeout 150 python3 -m pytest -q -m gpu tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -4
timeout 200 python3 -m bole_cli.cli bench kernels --batch 1,4,16,64 --nodes 16,32,64,128 --trees chain \
  --out-dir "$OUT/chain" 2>&1 | tee "$OUT/chain/bench.log" | tail -22
