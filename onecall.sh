#!/usr/bin/env bash
set -uo pipefail
export BOLE_SGLANG_WHEEL=$PWD/.whl/sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl PYTHONPATH=.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
python3 - <<'PY'
import json, os, torch
free, total = torch.cuda.mem_get_info()
p = torch.cuda.get_device_properties(0)
json.dump({"name": p.name, "total_memory": p.total_memory, "mem_get_info": [free, total],
           "torch": torch.__version__}, open(os.environ["OUT"] + "/memory.json", "w"), indent=1)
print(p.name, p.total_memory / 2**30, free / 2**30)
PY
INNER=${INNER:-540}
if [[ "$name" == *H200* ]]; then
  timeout -s INT $INNER bash experiments/owed_h200.sh ${JOB_H200:-whole}
else
  CHECK_MODEL=${CM:-27B} CHECK_PRESET=${CP:-paper-mbpp} CHECK_DRAFT_VOCAB=32768 CHECK_BATCH=${CB:-16} \
    timeout -s INT $INNER bash experiments/owed_h200.sh check
fi
if ! ls $OUT/*.tar.gz >/dev/null 2>&1; then
  tar czf $OUT/partial.tar.gz --exclude='*/cache/profiles/*' -C /tmp/owed . 2>/dev/null
fi
ls -la $OUT
