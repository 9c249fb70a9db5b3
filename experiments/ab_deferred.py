"""Issue 17 item 4 on the GPU: the deferred commit (bole_cli/kernels/tree_commit_deferred.py;
docs/design.md §2, "Deferred commit") against verify + tree_commit, in one process, one GDN
layer at a catalogue model's shape (bf16 activations, float32 state by default).

    python experiments/ab_deferred.py --batch 1,4,16,64 --cells chain:2,chain:4,chain:8,random:16,random:64 \
        --rows 8,16 --out OUT.json
    python experiments/ab_deferred.py --device cpu --model tiny --batch 2 --cells chain:4 --rows 4 --steps 3  # smoke

A step is the gated verify of every request's tree plus the commit of its accepted node
(chains: the whole chain, as a drafted chain that is all accepted; random trees of depth
<= 8: a random node). The deferred variant's pending rows carry over from step to step, so
steps alternate between appends and, when the rows overflow, a state write: each variant is
captured as a CUDA graph of one step and timed as the MEAN over many back-to-back replays
(CUDA events), not the median, which would hide the writes. Before timing, both variants run
--steps steps from the same pool; every step's o and u and the flushed final pool must agree.
--parts also times the verify and the commit apart (time_parts), to say which one moved, and
the verify under each of --verify-configs; --variants runs the deferred rows again with each
named kernel variant (kernel_variants.py) in place, or under its launch knobs, in the same
process.
Index of experiments: experiments/README.md; notes: experiments/NOTES.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext

from kernel_variants import VARIANTS, kernel_in_place, load_variant


def parse_cells(text):
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        tree, _, nodes = item.partition(":")
        if tree not in ("chain", "random"):
            raise SystemExit(f"--cells: {item!r}: expected chain:N or random:N")
        out.append((tree, int(nodes)))
    return out


def cell_inputs(torch, spec, batch, tree, nodes, seed, device, state_dtype):
    """bole_cli.timing.LayerInputs (as `bole bench kernels` builds them, bf16 activations)
    with a state pool of a decoding model's scale and, for chains, the whole chain accepted
    (a drafted chain that is all accepted: the longest path the rows must take)."""
    from bole_cli.timing import LayerInputs

    x = LayerInputs(torch, spec, batch, nodes, tree, seed, torch.bfloat16, state_dtype, sglang_buffers=False,
                    device=device)
    x.pool.mul_(0.05)
    if tree == "chain":
        x.accepted.fill_(nodes - 1)
    return x


def verify_fn(kernels, x, pool, pending, config=None):
    return lambda: kernels.tree_verify_gated(x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool,
                                             x.slots, x.parents, x.cu, check_trees=False,
                                             max_nodes=x.nodes, max_depth=x.max_depth, pending=pending,
                                             config=config)


def commit_fn(kernels, x, pool, pending, res):
    if pending is None:
        return lambda: kernels.tree_commit(pool, x.slots, x.k, res.u, res.log_p, x.parents, x.cu,
                                           x.accepted, check_trees=False)
    return lambda: kernels.tree_commit_deferred(pool, x.slots, x.k, res.u, res.log_p, x.parents, x.cu,
                                                x.accepted, pending, check_trees=False)


def step_fn(kernels, x, pool, pending, config=None):
    """One step on `pool` (and `pending`, if deferred): verify (under `config`), then
    commit; returns the verify's (o, u, log_p)."""
    verify = verify_fn(kernels, x, pool, pending, config)

    def step():
        res = verify()
        commit_fn(kernels, x, pool, pending, res)()
        return res
    return step


def time_parts(torch, kernels, x, rows, calls, timed, configs=(), config=None):
    """The step's two launches apart, each its own graph (mean over replays): verify over
    rows kept about half full (no commit runs), and the commit alone in steady state (the
    deferred one cycles through appends and state writes as in a step); then the verify
    again under each of `configs` (verify_0, verify_1, ...). `config`: a variant's knobs."""
    from bole_cli.timing import capture_graph, seconds_per_call

    pool = x.pool.clone()
    pend = None if rows is None else kernels.new_pending(pool, rows, x.k.shape[1])
    step = step_fn(kernels, x, pool, pend, config)
    for _ in range(4 * (rows or 0)):  # fill the rows to about half
        if int(pend.count.max()) >= rows // 2:
            break
        step()
    res = verify_fn(kernels, x, pool, pend, config)()
    out = {}
    parts = [("verify", verify_fn(kernels, x, pool, pend, config)),
             ("commit", commit_fn(kernels, x, pool, pend, res))]
    parts += [(f"verify_{i}", verify_fn(kernels, x, pool, pend, cfg)) for i, cfg in enumerate(configs)]
    for part, fn in parts:
        graph = capture_graph(torch, [fn])
        seconds_per_call(torch, graph.replay, 20, cuda=True)
        out[part] = timed(graph)
    return out


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="9b")
    ap.add_argument("--batch", default="1,4,16,64")
    ap.add_argument("--cells", default="chain:2,chain:4,chain:8,random:16,random:32,random:64")
    ap.add_argument("--rows", default="8,16", help="pending rows a slot, one deferred variant each")
    ap.add_argument("--steps", type=int, default=6, help="steps of the agreement check")
    ap.add_argument("--calls", type=int, default=200, help="graph replays timed per variant")
    ap.add_argument("--state-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--parts", action="store_true", help="also time verify and commit apart (time_parts)")
    ap.add_argument("--verify-configs", default="",
                    help="with --parts: verify launch configs to time too, e.g. 'BV=32,BK=64;BV=64,num_warps=8'")
    ap.add_argument("--variants", default="",
                    help="kernel_variants.py names to run with the deferred rows too, each in place of its kernel "
                         "(keys NAME_r16_us, ...), e.g. p-after")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    variants = list(filter(None, args.variants.split(",")))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown} (kernel_variants.py has {sorted(VARIANTS)})")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import torch
    import triton

    from bole_cli import kernels
    from bole_cli.catalog.models import resolve_model
    from bole_cli.runtime.model import tiny_spec
    from bole_cli.timing import capture_graph, seconds_per_call, warm_gpu

    spec = tiny_spec() if args.model == "tiny" else resolve_model(args.model)
    cuda = args.device == "cuda"
    state_dtype = getattr(torch, args.state_dtype)
    rows_list = [int(r) for r in args.rows.split(",")]
    configs = [{k: int(v) for k, v in (kv.split("=") for kv in c.split(","))}
               for c in filter(None, args.verify_configs.split(";"))]
    if cuda:
        warm_gpu(torch)
    table, t0 = [], time.time()
    for batch in (int(b) for b in args.batch.split(",")):
        for tree, nodes in parse_cells(args.cells):
            x = cell_inputs(torch, spec, batch, tree, nodes, 11, args.device, state_dtype)
            row = {"batch": batch, "tree": tree, "nodes": nodes}
            # agreement: the same steps from the same pool, o every step, the flushed pool at the end
            ref_pool = x.pool.clone()
            ref_step = step_fn(kernels, x, ref_pool, None)
            outs = [tuple(t.clone() for t in ref_step()) for _ in range(args.steps)]
            for variant in [None] + variants:  # the shipped kernels first, then each variant in place
                tag = "" if variant is None else f"{variant}_"
                knobs = VARIANTS[variant].config or None if variant else None  # a launch-knob variant's
                with nullcontext() if variant is None else kernel_in_place(VARIANTS[variant].site,
                                                                           load_variant(variant)):
                    for rows in rows_list:
                        pool = x.pool.clone()
                        pend = kernels.new_pending(pool, rows, spec.gdn_key_heads)
                        step = step_fn(kernels, x, pool, pend, knobs)
                        # every step's o (bf16) and u (float32: shows what bf16 rounding would hide)
                        diffs = [[rel(a, b) for a, b in zip(step(), want)] for want in outs]
                        row[f"{tag}r{rows}_o_diff"] = max(d[0] for d in diffs)
                        row[f"{tag}r{rows}_u_diff"] = max(d[1] for d in diffs)
                        kernels.tree_flush(pool, pend, check_trees=False)
                        row[f"{tag}r{rows}_state_diff"] = rel(pool, ref_pool)
                    if not cuda:
                        continue
                    # steady state: one step a graph, the mean over back-to-back replays
                    timed = [("plain", None)] if variant is None else []
                    for name, rows in timed + [(f"{tag}r{r}", r) for r in rows_list]:
                        pool = x.pool.clone()
                        pend = None if rows is None else kernels.new_pending(pool, rows, spec.gdn_key_heads)
                        graph = capture_graph(torch, [step_fn(kernels, x, pool, pend, knobs)])
                        seconds_per_call(torch, graph.replay, 20, cuda=True)
                        row[f"{name}_us"] = seconds_per_call(torch, graph.replay, args.calls, cuda=True) * 1e6
                        if args.parts:
                            parts = time_parts(torch, kernels, x, rows, args.calls,
                                               lambda g: seconds_per_call(torch, g.replay, args.calls, cuda=True) * 1e6,
                                               configs, knobs)
                            row.update({f"{name}_{part}_us": us for part, us in parts.items()})
            table.append(row)
            cells = "  ".join(f"{k} {v:.3g}" for k, v in row.items() if k.endswith(("_us", "_diff")))
            print(f"B{batch:3d} {tree:6s} T{nodes:3d}  {cells}", flush=True)
            if args.out:  # after every cell: an interrupt keeps what was measured
                blob = {"device": torch.cuda.get_device_name() if cuda else "cpu (interpreter, untimed)",
                        "torch": torch.__version__, "triton": triton.__version__, "model": spec.name,
                        "state_dtype": args.state_dtype, "verify_configs": configs, "variants": variants,
                        "command": "python " + " ".join(sys.argv),
                        "seconds": round(time.time() - t0, 1), "rows": table}
                tmp = args.out + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(blob, f, indent=1)
                os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
