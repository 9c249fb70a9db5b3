"""The split verify with Eq. 10's commit against the served path and the tf32 tables, side by
side in one process (docs/design.md §9; experiments/NOTES.md "The split verify"): is the
float32-exact state at the tables' speed?

Per cell (one GDN layer, Qwen3.5-9B shape by default, bf16 activations, float32 state):

- tables: tree_verify_gated at tf32 + tree_commit (Eq. 10) from its u: the kernels' tables,
          the time target (the served path within 1.05x of it), the state not exact;
- served: the tf32 verify + tree_commit_replay_gated (the accepted path replayed in float32);
- split:  tree_verify_gated at "split" (k . S as two tf32 products, A and U at tf32x3, the
          readout at tf32) + tree_commit from its u;

each as verify + commit in one CUDA graph over ROTATE input sets (bole_cli.timing, median of
replays), and the split and tables verifies alone. Agreement, before timing: the split
path's committed state against the served one's (both float32-exact: their difference is
float32 rounding) and its o against the tf32 verify's.

    python experiments/split_bench.py --out experiments/results/precision/split-h200.json
    python experiments/split_bench.py --smoke --out /tmp/s.json   # CPU, tf32 emulated: agreement only

Prints a table last. Index: experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys

GRID = [("random", b, n) for b in (1, 4, 16) for n in (16, 32, 64)] + \
       [("chain", b, n) for b in (1, 4, 16, 64) for n in (2, 4, 8, 16, 32, 64)]
SMOKE_GRID = [("random", 2, 12), ("chain", 2, 5)]


def cell(torch, kernels, spec, tree: str, batch: int, nodes: int, device: str, timed: bool) -> dict:
    from bole_cli.bench.kernel_bench import bole_commit, bole_verify, factors_step, rel_diff
    from bole_cli.kernels.types import VerifyResult
    from bole_cli.timing import ROTATE, LayerInputs, time_graph

    sets = [LayerInputs(torch, spec, batch, nodes, tree, 1000 * i + 7 * batch + nodes, torch.bfloat16, torch.float32,
                        sglang_buffers=False, device=device) for i in range(ROTATE if timed else 1)]

    def outs():
        return [VerifyResult.like(s.v) for s in sets]

    tf32_out, split_out = outs(), outs()
    served = [f for s, o in zip(sets, tf32_out) for f in (bole_verify(s, kernels, o), bole_commit(s, kernels))]
    tables = [f for s, o in zip(sets, tf32_out) for f in factors_step(s, kernels, o, {"precision": "tf32"})]
    split = [f for s, o in zip(sets, split_out) for f in factors_step(s, kernels, o, {"precision": "split"})]

    s0, pool0 = sets[0], sets[0].pool.clone()
    committed = {}
    for name, steps in (("served", served), ("split", split)):
        s0.pool.copy_(pool0)
        steps[0]()
        steps[1]()
        committed[name] = s0.pool[s0.slots.long()].clone()
    s0.pool.copy_(pool0)
    row = {"tree": tree, "batch": batch, "nodes": nodes,
           "split_vs_served_state": rel_diff(committed["split"], committed["served"]),
           "split_vs_tf32_o": rel_diff(split_out[0].o, tf32_out[0].o)}
    if timed:
        calls = len(sets)
        row.update(tables_us=time_graph(torch, tables, calls=calls), served_us=time_graph(torch, served, calls=calls),
                   split_us=time_graph(torch, split, calls=calls),
                   tables_verify_us=time_graph(torch, tables[0::2]), split_verify_us=time_graph(torch, split[0::2]))
        row["split_over_tables"] = row["split_us"] / row["tables_us"]
        row["served_over_tables"] = row["served_us"] / row["tables_us"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="9b")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the interpreter, no timings")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.smoke:  # sm_90's tf32 emulated, so that the agreement can tell split from tf32
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from tf32_emulation import _TF32, emulate_tf32

        emulate_tf32()
        _TF32["on"] = True
    import torch
    import triton

    from bole_cli import kernels
    from bole_cli.catalog.models import resolve_model

    if args.smoke:
        from types import SimpleNamespace

        spec = SimpleNamespace(name="tiny", gdn_key_heads=1, gdn_value_heads=2, gdn_key_dim=16, gdn_value_dim=16)
        device, grid = "cpu", SMOKE_GRID
    else:
        from bole_cli.timing import warm_gpu

        spec, device, grid = resolve_model(args.model), "cuda", GRID
        warm_gpu(torch)
    doc = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
           "versions": {"torch": torch.__version__, "triton": triton.__version__},
           "command": "python " + " ".join(sys.argv), "model": spec.name, "rows": [], "interrupted": False}

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    try:
        for tree, batch, nodes in grid:
            row = cell(torch, kernels, spec, tree, batch, nodes, device, timed=device == "cuda")
            doc["rows"].append(row)
            save()
            print(json.dumps(row), flush=True)
    except KeyboardInterrupt:
        doc["interrupted"] = True
    timed = [r for r in doc["rows"] if "split_us" in r]
    if timed:
        for key in ("split_over_tables", "served_over_tables"):
            doc[key + "_geomean"] = math.exp(sum(math.log(r[key]) for r in timed) / len(timed))
            doc[key + "_max"] = max(r[key] for r in timed)
    save()
    print(f"{'cell':16s} {'tables':>8s} {'served':>8s} {'split':>8s} {'split/t':>8s} {'served/t':>8s} "
          f"{'state diff':>10s}")
    for r in doc["rows"]:
        name = f"{r['tree'][:5]} {r['batch']}x{r['nodes']}"
        times = (f"{r['tables_us']:8.1f} {r['served_us']:8.1f} {r['split_us']:8.1f} {r['split_over_tables']:8.3f} "
                 f"{r['served_over_tables']:8.3f}") if "split_us" in r else f"{'(no timing on CPU)':>44s}"
        print(f"{name:16s} {times} {r['split_vs_served_state']:10.1e}")
    return 130 if doc["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
