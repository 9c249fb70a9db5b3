"""The deferred write's step by part (bench/deferred_write.py; experiments/NOTES.md "The
deferred write on chains"), Qwen3.5-9B GDN shape, one layer, chains in segments of 16, CUDA
graph replays: the place, the verify over the segments, the gather of the drafts' o; the
advance, the replay launch with no request due, a tenth due and all due; and the served
step's verify and commit on the same inputs beside them.

    python experiments/deferred_parts.py --batch 64 --nodes 2 --out parts.json
    python experiments/deferred_parts.py --smoke --out /tmp/p.json   # CPU: each part once, no timings
"""

from __future__ import annotations

import argparse
import json
import sys

WIDTH = 16


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, each part run once, untimed")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bole_cli import kernels  # first: it picks Triton's interpreter where no GPU is

    import triton
    from bole_cli.bench.deferred_write import PendingChains
    from bole_cli.catalog.models import resolve_model
    from bole_cli.kernels.pending_chain import pending_advance, pending_place
    from bole_cli.kernels.types import VerifyResult
    from bole_cli.timing import LayerInputs, time_graph, warm_gpu

    dev = "cpu" if args.smoke else "cuda"
    if args.smoke:
        from types import SimpleNamespace

        spec = SimpleNamespace(gdn_key_heads=2, gdn_value_heads=4, gdn_key_dim=32, gdn_value_dim=16)
        act = torch.float32
    else:
        spec, act = resolve_model("9b"), torch.bfloat16
        warm_gpu(torch)
    b, n = args.batch, args.nodes
    s = LayerInputs(torch, spec, b, n, "chain", 3, act, torch.float32, sglang_buffers=False, device=dev)
    c = PendingChains(torch, s, WIDTH)
    c.verify(torch, kernels)  # the segments hold real rows
    gated = dict(check_trees=False, max_nodes=WIDTH, max_depth=WIDTH - 1)
    req = torch.arange(b, device=dev)
    folds = {"none": torch.full((b,), -1, dtype=torch.int32, device=dev),
             "tenth": torch.where(req % 10 == 0, WIDTH - 3, -1).to(torch.int32),
             "all": torch.full((b,), WIDTH - 3, dtype=torch.int32, device=dev)}
    seg = c.segment
    served_out = VerifyResult.like(s.v)

    def fold(which):
        return lambda: c.fold_into(kernels, s.pool, folds[which])

    parts = {
        "place": lambda: pending_place(seg, c.draft, c.pending, c.rows, check_trees=False),
        "verify_segments": lambda: kernels.tree_verify_gated(*seg, s.A_log, s.dt_bias, s.pool, s.slots, c.parents,
                                                             c.cu, out=c.out, factors=False, **gated),
        "gather": lambda: torch.index_select(c.out.o, 0, c.rows, out=c.o),
        "advance": lambda: pending_advance(c.pending, s.accepted, c.fold, draft_nodes=n, width=WIDTH,
                                           check_trees=False),
        "fold_none": fold("none"), "fold_tenth": fold("tenth"), "fold_all": fold("all"),
        "deferred_verify": lambda: c.verify(torch, kernels),
        "served_verify": lambda: kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool,
                                                           s.slots, s.parents, s.cu, check_trees=False, max_nodes=n,
                                                           max_depth=n - 1, out=served_out, factors=False),
        "served_commit": lambda: kernels.tree_commit_replay_gated(s.pool, s.slots, s.k, s.v, s.a, s.b, s.A_log,
                                                                  s.dt_bias, s.parents, s.cu, s.accepted,
                                                                  check_trees=False, max_nodes=n, max_depth=n - 1),
    }
    rows = {}
    for name, fn in parts.items():
        fn()
        rows[name] = None if args.smoke else time_graph(torch, [fn])
    c.pending.zero_()
    doc = {"device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(),
           "versions": {"torch": torch.__version__, "triton": triton.__version__},
           "command": "python " + " ".join(sys.argv), "batch": b, "nodes": n, "width": WIDTH, "us": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for name, us in rows.items():
        print(f"{name:16s} {'-' if us is None else f'{us:8.1f}'} us")


if __name__ == "__main__":
    main()
