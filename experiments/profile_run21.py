"""Kernels for Nsight Compute (device call 21): one eager launch each of verify and commit
at batch 16 x 64 and batch 1 x 16 (random trees, Qwen3.5-9B GDN shape, bf16 activations).

    ncu --clock-control none -k regex:'tree_' --set full -o OUT python3 bench/profile_run21.py
"""

import torch

from bole_cli import kernels
from bole_cli.bench.kernel_bench import LayerInputs
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

spec = resolve_model("9b")
for batch, nodes in ((16, 64), (1, 16)):
    s = LayerInputs(torch, spec, batch, nodes, "random", 21, torch.bfloat16, torch.float32)
    n = batch * nodes
    out = VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                       torch.empty(n, 32, device="cuda"))
    kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                              s.parents, s.cu, check_trees=False, max_nodes=nodes, out=out)
    kernels.tree_commit(s.pool, s.slots, s.k, out.u, out.log_p, s.parents, s.cu, s.accepted,
                        check_trees=False)
    torch.cuda.synchronize()
    print(f"profiled batch {batch} x {nodes}", flush=True)
