"""GPU A/B: tree_verify's one-tile kernel with 16-bit Gram operands (GRAM16) vs tf32.

    python3 bench/ab_gram16.py OUT.json

Same process, same inputs (4 rotating sets, CUDA graphs, do_bench median); the built-in
rule / tuned table picks every other knob. Outputs of the two are compared before timing.
"""

import itertools
import json
import sys

import torch

from bole_cli import kernels
from bole_cli.bench.kernel_bench import ROTATE, LayerInputs, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

spec = resolve_model("9b")
warm_gpu(torch)
rows = []
for batch, nodes in itertools.product((1, 4, 16), (16, 32, 64)):
    sets = [LayerInputs(torch, spec, batch, nodes, "random", 100 * i + nodes, torch.bfloat16, torch.float32)
            for i in range(ROTATE)]
    n = batch * nodes
    res = {}
    outs = {}
    for g16 in (0, 1):
        o = [VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                          torch.empty(n, 32, device="cuda")) for s in sets]
        fns = [(lambda s=s, oo=oo, c={"GRAM16": g16}: kernels.tree_verify_gated(
            s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots, s.parents, s.cu,
            check_trees=False, max_nodes=nodes, out=oo, config=c)) for s, oo in zip(sets, o)]
        fns[0]()
        outs[g16] = o[0]
        res[g16] = time_graph(torch, fns, rep_ms=60)
    diff = max(((getattr(outs[1], f) .float() - getattr(outs[0], f).float()).norm()
                / getattr(outs[0], f).float().norm()).item() for f in ("o", "u", "log_p"))
    rows.append({"batch": batch, "nodes": nodes, "tf32_us": res[0], "gram16_us": res[1], "rel_diff": diff})
    print(f"B{batch:3d} T{nodes:3d}  tf32 Gram {res[0]:7.1f} us  16-bit Gram {res[1]:7.1f} us  "
          f"({res[0] / res[1]:.2f}x)  rel diff {diff:.1e}", flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "command": "python3 bench/ab_gram16.py", "rows": rows},
          open(sys.argv[1], "w"), indent=1)
