#!/usr/bin/env bash
# Device call 13: GPU kernel tests (the request_span / poison-branch edits were never run on a
# GPU), then bench/probe_run13.py (commit variants, verify time placement, launch floor).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 420 python3 bench/probe_run13.py "$OUT/probe-run13-h200.json" 2>&1 | tee "$OUT/probe.log" | grep -v Warn
timeout 150 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -4
