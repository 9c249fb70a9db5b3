#!/usr/bin/env bash
# Device call 5: GPU tests (kernels, plug-in, tuning), the final `bole bench kernels`,
# and `bole tune-kernels` for the Qwen3.5-4B/9B (one GDN shape) and 27B shapes.
set -u
W=$PWD/.whl
export PYTHONPATH=$PWD:$W/optuna-5.0.0-py3-none-any.whl:$W/colorlog-6.12.0-py3-none-any.whl:$W/tqdm-4.70.1-py3-none-any.whl
export PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels.py tests/test_plugin.py tests/test_tuning.py 2>&1 | tail -20 > "$OUT/gpu_tests.log"; tail -5 "$OUT/gpu_tests.log"
timeout 170 python3 -m bole_cli.cli bench kernels --out-dir "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -50
timeout -s INT 150 python3 -m bole_cli.cli tune-kernels --model 4b,9b,27b --max-minutes 2 --profile "$OUT/kernels.yaml" \
  --study-db "$OUT/studies.journal" --report "$OUT/tune.json" 2>&1 | tail -45 | tee "$OUT/tune.log"
