#!/usr/bin/env bash
# Device call 10: commit dot on tf32x3 (was "ieee" FMA work): GPU kernel tests, then
# `bole bench kernels` over the target grid, then what time is left of the plug-in GPU tests.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 90 python3 -m pytest -q -m gpu tests/test_kernels.py -x -p no:cacheprovider 2>&1 | tail -3
timeout 220 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random --out-dir "$OUT" 2>&1 \
  | tee "$OUT/bench.log" | tail -20
timeout 160 python3 -m pytest -q -m gpu tests/test_plugin.py -p no:cacheprovider -k "bfloat16 or tf32" -rA 2>&1 | tail -8
