#!/usr/bin/env bash
# Device call 26 (fourth session, last minutes of device time): verify v7 vs v9 A/B
# (bench/probe_run26.py); then, with v9 put in place of the shipped one-tile kernel on the
# device's copy only, the GPU kernel tests and the target grid, so that v9 can be shipped
# on this call's figures if it wins.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT/target_v9"
timeout 100 python3 bench/probe_run26.py "$OUT/probe-run26-h200.json" 2>&1 | grep -v Warning | tail -10
cp bench/variants/tree_verify_tile_v9_twopass.py bole_cli/kernels/tree_verify_tile.py
timeout 80 python3 -m pytest -q -m gpu tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -3
timeout 100 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random \
  --out-dir "$OUT/target_v9" 2>&1 | tee "$OUT/target_v9/bench.log" | tail -17
