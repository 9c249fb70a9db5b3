"""Grid over tree_verify launch configs at the headline shapes (GPU). Prints the best per shape.

python3 bench/sweep_verify.py OUT.json
"""

import itertools
import json
import sys

import torch

from bole_cli import kernels
from bole_cli.bench.kernel_bench import LayerInputs, ROTATE, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

spec = resolve_model("9b")
warm_gpu(torch)
rows = []
grid = list(itertools.product([16, 32, 64], [32, 64, 128], [4, 8], [1]))
for batch, nodes in itertools.product([1, 4, 16, 64], [16, 64]):
    sets = [LayerInputs(torch, spec, batch, nodes, "random", 100 * i + nodes, torch.bfloat16, torch.float32)
            for i in range(ROTATE)]
    n = batch * nodes
    outs = [VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                         torch.empty(n, 32, device="cuda")) for s in sets]
    best = None
    for bc, bv, warps, stages in grid:
        cfg = {"BC": bc, "BV": bv, "num_warps": warps, "num_stages": stages}
        try:
            us = time_graph(torch, [s.bole_verify(kernels, o, cfg) for s, o in zip(sets, outs)], rep_ms=40)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
            print("skip", cfg, type(exc).__name__, str(exc)[:80])
            continue
        rows.append({"batch": batch, "nodes": nodes, **cfg, "us": us})
        if best is None or us < best[1]:
            best = (cfg, us)
    default = [r["us"] for r in rows if r["batch"] == batch and r["nodes"] == nodes and r["BC"] == 32
               and r["BV"] == 64 and r["num_warps"] == 4 and r["num_stages"] == 1]
    print(f"B={batch:3d} T={nodes:3d} best {best[0]} {best[1]:.1f} us (default {default[0] if default else float('nan'):.1f})",
          flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
