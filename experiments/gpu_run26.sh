#!/usr/bin/env bash
# Device call 26 (fourth session, last minutes of device time): verify v7 vs v9 A/B
# (bench/probe_run26.py); then, with v9 put in place of the shipped one-tile kernel on the
# device's copy only, the GPU kernel tests and the target grid, so that v9 can be shipped
# on this call's figures if it wins.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT/target_v9"
timeout 100 python3 bench/probe_run26.py "$OUT/probe-run26-h200.json" 2>&1 | grep -v Warning | tail -10
# (run 26 copied bench/variants/tree_verify_tile_v9_twopass.py; v9 is now the V9_EDITS of
# bench/probe_run26.py applied to the shipped kernel, the same code)
python3 - <<'PY'
import ast, importlib, inspect, sys
sys.path.insert(0, "bench")
from variant_edits import load_variant
tree = ast.parse(open("bench/probe_run26.py").read())
ns = {}
for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "V9_EDITS":
        exec(compile(ast.Module([node], []), "probe_run26", "exec"), ns)
mod = importlib.import_module("bole_cli.kernels.tree_verify_tile")
src = inspect.getsource(load_variant(mod, ns["V9_EDITS"], "tile_v9"))
open("bole_cli/kernels/tree_verify_tile.py", "w").write(src)
PY
timeout 80 python3 -m pytest -q -m gpu tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -3
timeout 100 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random \
  --out-dir "$OUT/target_v9" 2>&1 | tee "$OUT/target_v9/bench.log" | tail -17
