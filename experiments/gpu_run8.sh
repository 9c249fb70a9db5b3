#!/usr/bin/env bash
# Device call 8: full `bole tune-kernels` for the Qwen3.5 4B/9B/27B GDN shapes (one-tile verify v4, commit c4).
set -u
W=$PWD/.whl
export PYTHONPATH=$PWD:$W/optuna-5.0.0-py3-none-any.whl:$W/colorlog-6.12.0-py3-none-any.whl:$W/tqdm-4.70.1-py3-none-any.whl
export PYTHONUNBUFFERED=1 COLUMNS=160
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 560 python3 -m bole_cli.cli tune-kernels --model 4b,9b,27b --nodes 16,32,64 --trials 10 --max-minutes 7.5 \
  --profile "$OUT/kernels.yaml" --study-db "$OUT/studies.journal" --report "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" | tail -70
