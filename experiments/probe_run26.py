"""GPU A/B (device call 26): verify v7 (shipped) vs v9 (two passes over the state slices,
V9_EDITS below), with the tuned table's config and with
BV 64 / BK 32 (where v9 compiles without spills). Same process, same inputs; outputs
compared with v7's before timing (CUDA graph, do_bench median).

    python3 bench/probe_run26.py OUT.json
"""

import importlib
import json
import sys

import torch
import triton

from bole_cli import kernels
from bole_cli.bench.kernel_bench import LayerInputs, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

verify_mod = importlib.import_module("bole_cli.kernels.tree_verify")
sys.path.insert(0, "bench")
from variant_edits import load_variant  # noqa: E402

# v9: X = K S^T, then U, in a first pass over the state slices; Y = Q S^T, then O, in a
# second (from L2): one accumulator live at a time
V9_EDITS = [
    ("            ys = tl.zeros([TP, BV], dtype=tl.float32)  # rows q_i^T S\n", ""),
    ("                qc = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0)"
     ".to(tl.float32)\n", ""),
    ("                ys += tl.dot(qc * inv_q[:, None], tl.trans(sb), input_precision=PRECISION)\n", ""),
    ("            uu = tl.dot(ainv, r, input_precision=PRECISION)\n",
     "            tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :],\n"
     "                     tl.dot(ainv, r, input_precision=PRECISION), mask=rmask[:, None] & vmask[None, :])\n"
     "            ys = tl.zeros([TP, BV], dtype=tl.float32)\n"
     "            for kb in range(0, KP, BK):\n"
     "                offs = kb + tl.arange(0, BK)\n"
     "                m2 = rmask[:, None] & (offs < K)[None, :]\n"
     "                qc = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0)"
     ".to(tl.float32)\n"
     "                sb = tl.load(state + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs[None, :],\n"
     "                             mask=vmask[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)\n"
     "                ys += tl.dot(qc * inv_q[:, None], tl.trans(sb), input_precision=PRECISION)\n"),
    ("            tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], uu, mask=tile)\n", ""),
]
v9 = load_variant(importlib.import_module("bole_cli.kernels.tree_verify_tile"), V9_EDITS, "tile_v9")
VERIFY = {"v7": verify_mod.tree_verify_tile_kernel, "v9": v9.tree_verify_tile_kernel}
CONFIGS = {"table": None, "bv64bk32": {"BV": 64, "BK": 32, "VSPLIT": 1, "num_warps": 4, "num_stages": 1}}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main(out_path: str) -> None:
    spec_ = resolve_model("9b")
    warm_gpu(torch)
    rows = []
    for batch, nodes, tree in ((1, 16, "random"), (1, 64, "random"), (4, 32, "random"), (4, 64, "random"),
                               (16, 16, "random"), (16, 32, "random"), (16, 64, "random"), (16, 64, "chain"),
                               (64, 64, "random")):
        s = LayerInputs(torch, spec_, batch, nodes, tree, 11, torch.bfloat16, torch.float32)
        n = batch * nodes
        res, outs = {}, {}
        for cname, cfg in CONFIGS.items():
            if cfg is not None and batch < 16:
                continue
            for name, kern in VERIFY.items():
                verify_mod.tree_verify_tile_kernel = kern
                out = VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                                   torch.empty(n, 32, device="cuda"))

                def run(out=out, cfg=cfg):
                    kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                                              s.parents, s.cu, check_trees=False, max_nodes=nodes, out=out,
                                              config=cfg)
                run()
                outs[f"{name}/{cname}"] = out
                res[f"{name}/{cname}"] = time_graph(torch, [run], rep_ms=60)
        verify_mod.tree_verify_tile_kernel = VERIFY["v7"]
        err = max(rel(getattr(o, f), getattr(outs["v7/table"], f)) for o in outs.values() for f in ("o", "u", "log_p"))
        rows.append({"batch": batch, "nodes": nodes, "tree": tree, **{f"{k}_us": v for k, v in res.items()},
                     "max_rel_diff_vs_v7": err})
        print(f"verify B{batch:2d} T{nodes:2d} {tree:6s} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items())
              + f"  diff {err:.1e}", flush=True)
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "command": "python3 " + " ".join(sys.argv), "verify": rows},
                  f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
