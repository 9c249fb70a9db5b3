#!/usr/bin/env bash
# Device call 21 (fourth session): Nsight Compute on verify v7 / commit c7 (where the time
# goes, from counters), the GPU kernel tests owed for the block-merging solve (dd027dc),
# and the target grid again.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/bole-out}; mkdir -p "$OUT/target" "$OUT/prof"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
echo "ncu: $NCU"
timeout 200 "$NCU" --clock-control none --import-source yes -k regex:'tree_' --set full \
  -o "$OUT/prof/verify_commit" python3 bench/profile_run21.py 2>&1 | tail -6
if [ -f "$OUT/prof/verify_commit.ncu-rep" ]; then
  "$NCU" -i "$OUT/prof/verify_commit.ncu-rep" --page details > "$OUT/prof/details.txt" 2>&1
  "$NCU" -i "$OUT/prof/verify_commit.ncu-rep" --page source --csv --print-source cuda > "$OUT/prof/source.csv" 2>&1
  grep -E "^  [a-z_]+tree|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Reg|Memory Throughput|DRAM Throughput|Compute \(SM\) Th|Local Memory|Warp Cycles Per Issued|Issued Ipc|No Eligible|Waves Per SM|Shared Memory Configuration Size|Dynamic Shared|Static Shared" "$OUT/prof/details.txt" | head -90
fi
timeout 150 python3 -m pytest -q -m gpu tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -4
timeout 120 python3 -m bole_cli.cli bench kernels --batch 1,4,16 --nodes 16,32,64 --trees random \
  --out-dir "$OUT/target" 2>&1 | tee "$OUT/target/bench.log" | tail -18
