"""GPU A/B (device call 14): verify v4 (level walk) vs v5 (closure by squaring) vs v5 with
the Gram loads first; commit c4 vs c7 at single-layer batches and all 24 layers.

    python3 bench/probe_run14.py OUT.json

Same process, same inputs; every variant's outputs are compared with the shipped kernel's
before timing (CUDA graph, do_bench median).
"""

import importlib
import importlib.util
import json
import sys

import torch
import triton

from bole_cli import kernels
from bole_cli.bench.kernel_bench import LayerInputs, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

commit_mod = importlib.import_module("bole_cli.kernels.tree_commit")
verify_mod = importlib.import_module("bole_cli.kernels.tree_verify")


def load_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


VERIFY = {"v4_walk": load_file("bench/variants/tree_verify_tile_v4_walk.py", "v4").tree_verify_tile_kernel,
          "v5_closure": load_file("bench/variants/tree_verify_tile_v5_closure.py", "v5").tree_verify_tile_kernel,
          "v5_shipped": verify_mod.tree_verify_tile_kernel}
COMMIT = {"c4": load_file("bench/variants/tree_commit_c4.py", "c4")._tree_commit_kernel,
          "c7_shipped": commit_mod._tree_commit_kernel}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main(out_path: str) -> None:
    spec = resolve_model("9b")
    warm_gpu(torch)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "command": "python3 bench/probe_run14.py"}
    vrows = []
    for batch, nodes, tree in ((1, 16, "random"), (1, 64, "random"), (4, 32, "random"), (4, 64, "random"),
                               (16, 16, "random"), (16, 64, "random"), (16, 64, "chain"), (64, 64, "random")):
        s = LayerInputs(torch, spec, batch, nodes, tree, 11, torch.bfloat16, torch.float32)
        n = batch * nodes
        res, outs = {}, {}
        for name, kern in VERIFY.items():
            verify_mod.tree_verify_tile_kernel = kern
            out = VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                               torch.empty(n, 32, device="cuda"))

            def run(out=out):
                kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                                          s.parents, s.cu, check_trees=False, max_nodes=nodes, out=out)
            run()
            outs[name] = out
            res[name] = time_graph(torch, [run], rep_ms=60)
        verify_mod.tree_verify_tile_kernel = VERIFY["v5_shipped"]
        err = max(rel(getattr(outs[k], f), getattr(outs["v4_walk"], f))
                  for k in VERIFY for f in ("o", "u", "log_p"))
        vrows.append({"batch": batch, "nodes": nodes, "tree": tree, **{f"{k}_us": v for k, v in res.items()},
                      "max_rel_diff_vs_v4": err})
        print(f"verify B{batch:2d} T{nodes:2d} {tree:6s} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items())
              + f"  diff {err:.1e}", flush=True)
    report["verify"] = vrows

    crows = []
    for batch, layers in ((1, 1), (4, 1), (16, 1), (64, 1), (16, 24)):
        base = LayerInputs(torch, spec, batch, 64, "random", 7, torch.bfloat16, torch.float32)
        n = batch * 64
        lead = (layers,) if layers > 1 else ()
        pool0 = torch.randn(*lead, batch + 1, 32, 128, 128, device="cuda")
        k = torch.randn(*lead, n, 16, 128, device="cuda").to(torch.bfloat16)
        u = torch.randn(*lead, n, 32, 128, device="cuda")
        lp = -torch.rand(*lead, n, 32, device="cuda")
        pool = pool0.clone()
        res, states = {}, {}
        for name, kern in COMMIT.items():
            commit_mod._tree_commit_kernel = kern

            def commit():
                kernels.tree_commit(pool, base.slots, k, u, lp, base.parents, base.cu, base.accepted,
                                    check_trees=False)
            pool.copy_(pool0)
            commit()
            states[name] = pool.clone()
            res[name] = time_graph(torch, [commit], rep_ms=60)
        commit_mod._tree_commit_kernel = COMMIT["c7_shipped"]
        err = rel(states["c7_shipped"], states["c4"])
        crows.append({"batch": batch, "layers": layers, **{f"{k}_us": v for k, v in res.items()},
                      "rel_diff": err})
        print(f"commit B{batch:2d} L{layers:2d} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items())
              + f"  diff {err:.1e}", flush=True)
        pool = pool0 = k = u = lp = states = None
    report["commit"] = crows
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
