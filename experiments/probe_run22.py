"""GPU A/B (device call 22): commit c7 (walk by dependent loads of `parents`: shipped) vs c8
(the request's parents in registers, a reduction a level) vs c8p (c8 with the state
tile loaded before the walk), over value tiles and warps, at one layer (batch 1, 4, 16, 64)
and 24 layers (batch 16). Same process, same inputs; every variant's state is compared with
c7's before timing (CUDA graph, do_bench median).

    python3 bench/probe_run22.py OUT.json
"""

import importlib
import json
import sys

import torch
import triton

from bole_cli import kernels
from bole_cli.bench.kernel_bench import LayerInputs, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model

sys.path.insert(0, "bench")
from variant_edits import load_variant  # noqa: E402

commit_mod = importlib.import_module("bole_cli.kernels.tree_commit")


# c8: the request's parents loaded once into registers, the walk a reduction a level
C8_EDITS = [
    ("    DP: tl.constexpr, USE_L2NORM: tl.constexpr,\n):",
     "    DP: tl.constexpr, TN: tl.constexpr, USE_L2NORM: tl.constexpr,\n):"),
    ("        slot = tl.load(state_idx + b).to(tl.int64)\n",
     "        slot = tl.load(state_idx + b).to(tl.int64)\n"
     "        nodes = tl.arange(0, TN)\n"
     "        par = tl.load(parents + start + nodes, mask=nodes < (tl.load(cu + b + 1) - start),"
     " other=-1).to(tl.int32)\n"),
    ("nxt = tl.load(parents + start + cur).to(tl.int32)", "nxt = tl.sum(tl.where(nodes == cur, par, 0), axis=0)"),
]
# c8p: c8 with the state tile loaded before the walk (in flight during it)
C8P_EDITS = C8_EDITS + [
    ("        s_old = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)\n", ""),
    ("        path_sum = tl.zeros([BV, KP], dtype=tl.float32)\n",
     "        s_old = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)\n"
     "        path_sum = tl.zeros([BV, KP], dtype=tl.float32)\n"),
]

SHIPPED = commit_mod._tree_commit_kernel
VARIANTS = {"c7": SHIPPED,
            "c8": load_variant(commit_mod, C8_EDITS, "commit_c8")._tree_commit_kernel,
            "c8p": load_variant(commit_mod, C8P_EDITS, "commit_c8p")._tree_commit_kernel}
CONFIGS = [{"BV": 16, "num_warps": 4}, {"BV": 32, "num_warps": 4}, {"BV": 64, "num_warps": 4},
           {"BV": 64, "num_warps": 8}]


class TNLaunch:
    """c8 and c8p also take TN (the parents held per request). Run 22 ran with c8 shipped
    and c7 as the variant; c7 is shipped again since, and c8/c8p are its edits."""

    def __init__(self, kern):
        self.kern = kern

    def __getitem__(self, grid):
        def launch(*args, **kw):
            return self.kern[grid](*args, TN=256, **kw)
        return launch


def main(out_path: str) -> None:
    spec = resolve_model("9b")
    warm_gpu(torch)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "command": "python3 bench/probe_run22.py"}
    rows = []
    for batch, layers in ((1, 1), (4, 1), (16, 1), (64, 1), (16, 24)):
        base = LayerInputs(torch, spec, batch, 64, "random", 7, torch.bfloat16, torch.float32)
        n = batch * 64
        lead = (layers,) if layers > 1 else ()
        pool0 = torch.randn(*lead, batch + 1, 32, 128, 128, device="cuda")
        k = torch.randn(*lead, n, 16, 128, device="cuda").to(torch.bfloat16)
        u = torch.randn(*lead, n, 32, 128, device="cuda")
        lp = -torch.rand(*lead, n, 32, device="cuda")
        pool = pool0.clone()
        ref = None
        for cfg in CONFIGS:
            res = {}
            for name, kern in VARIANTS.items():
                commit_mod._tree_commit_kernel = kern if name == "c7" else TNLaunch(kern)

                def commit():
                    kernels.tree_commit(pool, base.slots, k, u, lp, base.parents, base.cu, base.accepted,
                                        check_trees=False, config=cfg)
                pool.copy_(pool0)
                commit()
                if ref is None:
                    ref = pool.clone()
                err = ((pool - ref).norm() / ref.norm()).item()
                res[name] = time_graph(torch, [commit], rep_ms=60)
                res[name + "_diff"] = err
            commit_mod._tree_commit_kernel = SHIPPED
            rows.append({"batch": batch, "layers": layers, **cfg, **{f"{k}_us" if not k.endswith("diff") else k: v
                                                                    for k, v in res.items()}})
            print(f"commit B{batch:2d} L{layers:2d} BV{cfg['BV']:3d} w{cfg['num_warps']} "
                  + "  ".join(f"{k} {v:6.1f}" for k, v in res.items() if not k.endswith("diff"))
                  + "  diff " + " ".join(f"{res[k + '_diff']:.1e}" for k in VARIANTS), flush=True)
        pool = pool0 = k = u = lp = ref = None
        torch.cuda.empty_cache()
    report["commit"] = rows
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
