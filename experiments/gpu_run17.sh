#!/usr/bin/env bash
# Device call 17: retune tree_commit (c7, 4B/9B and 27B shapes) and tree_verify (v7, 9B shape)
# into the shipped table, then `bole bench kernels` on the target grid with it.
set -u
W=$PWD/.whl
export PYTHONPATH=$PWD:$W/optuna-5.0.0-py3-none-any.whl:$W/colorlog-6.12.0-py3-none-any.whl:$W/tqdm-4.70.1-py3-none-any.whl
export PYTHONUNBUFFERED=1 COLUMNS=160
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT"
T=profiles/h200/kernels.yaml
timeout 130 python3 -m bole_cli.cli tune-kernels --model 9b,27b --kernels tree_commit --trials 12 --max-minutes 1.5 \
  --profile $T --study-db "$OUT/studies.journal" --report "$OUT/tune-commit.json" 2>&1 | tee "$OUT/tune-commit.log" | tail -14
timeout 290 python3 -m bole_cli.cli tune-kernels --model 9b --kernels tree_verify --nodes 16,32,64 --trials 8 --max-minutes 4 \
  --profile $T --study-db "$OUT/studies.journal" --report "$OUT/tune-verify.json" 2>&1 | tee "$OUT/tune-verify.log" | tail -18
cp $T "$OUT/kernels.yaml"
timeout 140 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random --out-dir "$OUT" 2>&1 \
  | tee "$OUT/bench.log" | tail -18
