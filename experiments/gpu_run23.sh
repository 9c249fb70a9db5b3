#!/usr/bin/env bash
# Device call 23 (fourth session): verify v7 vs v8 A/B (bench/probe_run23.py), then the two
# plug-in GPU tests that run 19's timeout cut (batch 1 x 128, and the tf32 trade-off).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 170 python3 bench/probe_run23.py "$OUT/probe-run23-h200.json" 2>&1 | grep -v Warning | tail -14
timeout 390 python3 -m pytest -v -s -m gpu tests/test_plugin.py -k "1-128 or tf32" -p no:cacheprovider 2>&1 \
  | tee "$OUT/plugin.log" | grep -E "PASS|FAIL|rel|passed|failed|Error" | tail -12
