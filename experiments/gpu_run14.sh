#!/usr/bin/env bash
# Device call 14: A/B of verify v4/v5 and commit c4/c7 (bench/probe_run14.py), GPU kernel
# tests, then `bole bench kernels` on the target grid with the shipped kernels.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 200 python3 bench/probe_run14.py "$OUT/probe-run14-h200.json" 2>&1 | grep -v Warn | tee "$OUT/probe.log"
timeout 120 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -3
timeout 200 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random --out-dir "$OUT" 2>&1 \
  | tee "$OUT/bench.log" | tail -30
