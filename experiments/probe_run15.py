"""GPU A/B (device call 15): verify v4 (level walk) vs v5 (closure by squaring) vs v6 (walk
8 levels, then square: shipped), random and chain trees.

    python3 bench/probe_run15.py OUT.json
"""

import json
import sys

import torch
import triton

sys.path.insert(0, "bench")
import probe_run14 as p14  # noqa: E402

from bole_cli import kernels  # noqa: E402
from bole_cli.bench.kernel_bench import LayerInputs, time_graph, warm_gpu  # noqa: E402
from bole_cli.catalog.models import resolve_model  # noqa: E402
from bole_cli.kernels.reference import VerifyResult  # noqa: E402

VERIFY = {"v4_walk": p14.VERIFY["v4_walk"], "v5_closure": p14.VERIFY["v5_closure"],
          "v6_shipped": p14.verify_mod.tree_verify_tile_kernel}


def main(out_path: str) -> None:
    spec = resolve_model("9b")
    warm_gpu(torch)
    rows = []
    for batch, nodes, tree in ((1, 16, "random"), (1, 64, "random"), (1, 64, "chain"), (4, 32, "random"),
                               (4, 64, "random"), (16, 16, "random"), (16, 32, "random"), (16, 64, "random"),
                               (16, 64, "chain"), (64, 64, "random"), (64, 64, "chain")):
        s = LayerInputs(torch, spec, batch, nodes, tree, 11, torch.bfloat16, torch.float32)
        n = batch * nodes
        res, outs = {}, {}
        for name, kern in VERIFY.items():
            p14.verify_mod.tree_verify_tile_kernel = kern
            out = VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                               torch.empty(n, 32, device="cuda"))

            def run(out=out):
                kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                                          s.parents, s.cu, check_trees=False, max_nodes=nodes, out=out)
            run()
            outs[name] = out
            res[name] = time_graph(torch, [run], rep_ms=60)
        p14.verify_mod.tree_verify_tile_kernel = list(VERIFY.values())[-1]  # the shipped one
        first = next(iter(VERIFY))  # the reference variant (v4_walk in run 15)
        err = max(p14.rel(getattr(outs[k], f), getattr(outs[first], f))
                  for k in VERIFY for f in ("o", "u", "log_p"))
        rows.append({"batch": batch, "nodes": nodes, "tree": tree, **{f"{k}_us": v for k, v in res.items()},
                     "max_rel_diff_vs_v4": err})
        print(f"verify B{batch:2d} T{nodes:2d} {tree:6s} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items())
              + f"  diff {err:.1e}", flush=True)
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "command": "python3 " + " ".join(sys.argv), "verify": rows},
                  f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
