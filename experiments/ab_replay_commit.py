"""The replay commit's launch configurations against Eq. 10's factorised commit, on the GPU
(experiments/README.md, rows P-2 and P-7): one layer's commit for random trees and chains at
batch 1-64, and all of a model's GDN layers in one launch. Each config is checked against the
float64 reference (one layer, set 0) before it is timed; the factorised commit is timed on
the same inputs (its u from a float32 verify).

    python experiments/ab_replay_commit.py --out $OUT/ab-replay.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CELLS = ["random:1x16", "random:16x16", "random:4x64", "random:16x64", "random:64x64", "chain:64x2", "chain:16x4",
         "chain:1x64", "chain:16x64", "chain:64x8", "chain:1x256", "chain:16x256"]
# the node-by-node replay (c10, shipped) at value tiles of 8-64 on 1-4 warps; the passes
# form before it (c9) is timed at its commit (experiments/README.md P-2, P-7)
CONFIGS = [{"BV": 8, "num_warps": 1}, {"BV": 16, "num_warps": 2}, {"BV": 32, "num_warps": 1},
           {"BV": 32, "num_warps": 2}, {"BV": 32, "num_warps": 4}, {"BV": 64, "num_warps": 4},
           {"BV": 16, "num_warps": 1, "num_stages": 2}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--model", default="9b")
    args = ap.parse_args()
    import torch
    import triton

    from bole_cli import kernels
    from bole_cli.catalog.models import resolve_model
    from bole_cli.kernels.reference import tree_commit_replay_ref
    from bole_cli.timing import ROTATE, LayerInputs, time_graph, warm_gpu

    spec = resolve_model(args.model)
    warm_gpu(torch)
    rows = []
    for cell in CELLS:
        tree, shape = cell.split(":")
        batch, nodes = (int(x) for x in shape.split("x"))
        sets = [LayerInputs(torch, spec, batch, nodes, tree, 100 * i + nodes, torch.bfloat16, torch.float32,
                            sglang_buffers=False) for i in range(ROTATE)]
        for s in sets:
            s.g, s.beta = kernels.gdn_gates(s.A_log, s.a, s.dt_bias, s.b)
            s.res = kernels.tree_verify(s.q, s.k, s.v, s.g, s.beta, s.pool, s.slots, s.parents, s.cu,
                                        config={"precision": "ieee"}, check_trees=False, max_nodes=nodes)
            s.commit = dict(max_nodes=nodes, check_trees=False)
        s0 = sets[0]
        pool0 = s0.pool.clone()  # every timed commit writes the pools: check on copies of this
        want = tree_commit_replay_ref(pool0, s0.slots, s0.k, s0.v, s0.g, s0.beta, s0.parents, s0.cu, s0.accepted)
        row = {"cell": cell}
        errs = {}
        for cfg in [None] + CONFIGS:
            pool = pool0.clone()
            kernels.tree_commit_replay(pool, s0.slots, s0.k, s0.v, s0.g, s0.beta, s0.parents, s0.cu, s0.accepted,
                                       config=cfg, max_nodes=nodes)
            errs[str(cfg)] = ((pool.double() - want.double()).norm() / want.double().norm()).item()
        factors = [lambda s=s: kernels.tree_commit(s.pool, s.slots, s.k, s.res.u, s.res.log_p, s.parents, s.cu,
                                                    s.accepted, check_trees=False) for s in sets]
        row["factors_us"] = time_graph(torch, factors)
        for cfg in [None] + CONFIGS:
            name = "default" if cfg is None else ",".join(f"{k}{v}" for k, v in cfg.items())
            err = errs[str(cfg)]
            fns = [lambda s=s, cfg=cfg: kernels.tree_commit_replay(s.pool, s.slots, s.k, s.v, s.g, s.beta,
                                                                    s.parents, s.cu, s.accepted, config=cfg,
                                                                    **s.commit) for s in sets]
            row[name] = {"us": time_graph(torch, fns), "err": err}
            print(f"  {cell:14s} {name:34s} {row[name]['us']:9.1f} us  err {err:.1e}", flush=True)
        rows.append(row)
        best = min((v["us"], k) for k, v in row.items() if isinstance(v, dict))
        print(f"{cell:14s} factors {row['factors_us']:8.1f}  replay default {row['default']['us']:8.1f} "
              f"(err {row['default']['err']:.1e})  best {best[1]} {best[0]:.1f}", flush=True)
    # every GDN layer in one launch, batch 16, random trees of 64
    layers, batch, nodes = spec.n_gdn_layers, 16, 64
    base = LayerInputs(torch, spec, batch, nodes, "random", 7, torch.bfloat16, torch.float32, sglang_buffers=False)
    h, hv, kd, vd = spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim
    n = batch * nodes
    pool = torch.randn(layers, batch + 1, hv, vd, kd, device="cuda")
    k = torch.randn(layers, n, h, kd, device="cuda").to(torch.bfloat16)
    u = torch.randn(layers, n, hv, vd, device="cuda")
    log_p = -torch.rand(layers, n, hv, device="cuda")
    beta = torch.rand(layers, n, hv, device="cuda")
    v = u.to(torch.bfloat16)
    all_layers = {"factors_us": time_graph(torch, [lambda: kernels.tree_commit(
        pool, base.slots, k, u, log_p, base.parents, base.cu, base.accepted, check_trees=False)])}
    for cfg in [None] + CONFIGS:
        name = "default" if cfg is None else ",".join(f"{k_}{v}" for k_, v in cfg.items())
        all_layers[name] = time_graph(torch, [lambda cfg=cfg: kernels.tree_commit_replay(
            pool, base.slots, k, v, log_p, beta, base.parents, base.cu, base.accepted,
            check_trees=False, max_nodes=nodes, config=cfg)])
    print(f"all {layers} layers x batch {batch}: factors {all_layers['factors_us']:.1f}  replay "
          + "  ".join(f"{k_} {v:.1f}" for k_, v in all_layers.items() if k_ != "factors_us"))
    doc = {"device": torch.cuda.get_device_name(), "versions": {"torch": torch.__version__,
                                                               "triton": triton.__version__},
           "command": "python experiments/ab_replay_commit.py " + " ".join(sys.argv[1:]),
           "model": spec.name, "cells": rows, "all_layers": {"layers": layers, "batch": batch, **all_layers}}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
