#!/usr/bin/env bash
# Device call 9: `bole bench kernels` (v4 verify + c4 commit, tuned tables installed), then the
# SGLang plug-in GPU tests.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 260 python3 -m bole_cli.cli bench kernels --out-dir "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -52
timeout 290 python3 -m pytest -q -m gpu tests/test_plugin.py -p no:cacheprovider 2>&1 | tail -8
