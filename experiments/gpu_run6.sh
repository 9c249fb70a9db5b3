#!/usr/bin/env bash
# Device call 6: final `bole bench kernels` (commit kernel v1) and `bole bench e2e` for 9B.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 175 python3 -m bole_cli.cli bench kernels --out-dir "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -48
timeout -s INT 200 python3 -m bole_cli.cli bench e2e --model 9b --batch 1,4,16 --context 4096 --max-probes 5 \
  --out-dir "$OUT" 2>&1 | tee "$OUT/e2e-9b.log" | tail -30
