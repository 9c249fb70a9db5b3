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

# The one-launch commit of all 24 GDN layers at batch 16: launch knobs beyond the tuner's
# single-layer buckets.
layers, batch, nodes = spec.n_gdn_layers, 16, 64
base = LayerInputs(torch, spec, batch, nodes, "random", 7, torch.bfloat16, torch.float32)
n = batch * nodes
pool = torch.randn(layers, batch + 1, 32, 128, 128, device="cuda")
k = torch.randn(layers, n, 16, 128, device="cuda").to(torch.bfloat16)
u = torch.randn(layers, n, 32, 128, device="cuda")
lp = -torch.rand(layers, n, 32, device="cuda")
commit_rows = []
for bv, w, st in ((64, 4, 1), (64, 4, 2), (64, 8, 1), (128, 8, 1), (32, 4, 2), (32, 2, 1)):
    cfg = {"BV": bv, "num_warps": w, "num_stages": st}
    try:
        us = time_graph(torch, [lambda c=cfg: kernels.tree_commit(pool, base.slots, k, u, lp, base.parents, base.cu,
                                                                   base.accepted, check_trees=False, config=c)],
                        rep_ms=80)
    except Exception as exc:  # noqa: BLE001
        print("skip", cfg, type(exc).__name__, str(exc)[:80], flush=True)
        continue
    commit_rows.append({**cfg, "us": us})
    print(f"commit 24 layers B16 BV{bv} w{w} s{st}: {us:.1f} us", flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "command": "python3 bench/ab_gram16.py", "rows": rows,
           "commit_all_layers_b16": commit_rows}, open(sys.argv[1], "w"), indent=1)
