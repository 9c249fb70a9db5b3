#!/usr/bin/env bash
# Device call 4: tree_verify variant sweep; measured calibrations for Qwen3.5-4B and 27B.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 230 python3 bench/sweep_verify.py "$OUT/sweep_variants.json" 2>&1 | grep -v '^skip' | tee "$OUT/sweep.log"
for m in 4b 27b; do
  timeout -s INT 150 python3 -m bole_cli.cli calibrate --gpu h200 --model $m --measure --batch 1,4,8,16 \
    --kv 1024,8192 --grid 16,32,64,128,256 --repeats 5 --out "$OUT/$m.yaml" --no-plot 2>&1 | tail -16 | tee "$OUT/calibrate-$m.log"
done
