"""A/B of kernel variants against the shipped kernel, on the GPU, in one process.

    python experiments/ab_kernels.py verify v8 gram-tf32 [--cases 1x16,16x64,16x64:chain] [--config BV=64,BK=32]
    python experiments/ab_kernels.py blocked b-no-pairs b-no-diag --cases 16x128,16x256
    python experiments/ab_kernels.py commit c8 cA --layers 24 --cases 16x64 [--out FILE.json]
    python experiments/ab_kernels.py replay r-state-first --layers 24 --cases 16x64 [--accepted int64]
    python experiments/ab_kernels.py --list | --check | --launch-floor | --source v8
    ncu -k regex:tree_ --set full -o OUT python experiments/ab_kernels.py verify --once --cases 16x64,1x16

Variants are text edits of the shipped kernels (experiments/kernel_variants.py). Same inputs
for every kernel (bole_cli.timing.LayerInputs, as `bole bench kernels` uses: Qwen3.5-9B GDN
shape, bf16 activations, float32 state); each variant's outputs are compared with the
shipped kernel's, then each is timed as a CUDA-graph replay (do_bench median). --config applies to every kernel (a
variant's own knobs go on top); --check applies every edit and imports the result, no GPU
needed; --once launches each kernel once, eagerly, untimed (for Nsight Compute); --source
prints a variant's edited module, to put it in place of the shipped file on a scratch copy
(e.g. for `bole bench kernels` or the GPU tests; not for variants with extra constexprs).
Index of experiments and their results: experiments/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from kernel_variants import SITES, VARIANTS, edited_source, kernel_in_place, load_variant

VERIFY_CASES = "1x16,1x64,1x64:chain,4x32,4x64,16x16,16x32,16x64,16x64:chain,64x64,64x64:chain"
COMMIT_CASES = "1x64,4x64,16x64,64x64"
REPLAY_CASES = "1x16,16x16,16x64,64x64,64x2:chain,16x4:chain,1x64:chain,16x64:chain"
BLOCKED_CASES = "1x128,16x128,64x128,16x256"


def parse_cases(text: str) -> list[tuple[int, int, str]]:
    """"16x64:chain" -> (16, 64, "chain"); the tree shape defaults to random (depth <= 8)."""
    cases = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        size, _, tree = item.partition(":")
        batch, nodes = size.split("x")
        cases.append((int(batch), int(nodes), tree or "random"))
    return cases


def parse_config(text: str) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in filter(None, text.split(",")))}


class WithConstexprs:
    """Launches a kernel with extra constexpr arguments that its edits introduced."""

    def __init__(self, kernel, constexprs: dict):
        self.kernel, self.constexprs = kernel, constexprs

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid](*args, **self.constexprs, **kw)


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def case_runner(torch, kernels, kind, spec, batch, nodes, tree, layers, accepted="int32"):
    """One case's inputs, built once for all kernels; run(config) -> (launch fn, its outputs).
    The commits take `accepted` in that dtype (the runtime's is int64, SGLang's int32)."""
    from bole_cli.kernels.reference import VerifyResult
    from bole_cli.timing import LayerInputs

    s = LayerInputs(torch, spec, batch, nodes, tree, 11, torch.bfloat16, torch.float32, sglang_buffers=False)
    s.accepted = s.accepted.to(getattr(torch, accepted))
    n, hv, vd = batch * nodes, spec.gdn_value_heads, spec.gdn_value_dim
    if kind in ("verify", "blocked"):
        def run(config):
            out = VerifyResult(torch.empty_like(s.v), torch.empty(n, hv, vd, device="cuda"),
                               torch.empty(n, hv, device="cuda"))

            def fn():
                kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots, s.parents,
                                          s.cu, check_trees=False, max_nodes=nodes, max_depth=s.max_depth, out=out,
                                          config=config)
            return fn, lambda: out
        return run
    lead = (layers,) if layers > 1 else ()
    pool0 = torch.randn(*lead, *s.pool.shape, device="cuda")
    k = torch.randn(*lead, n, spec.gdn_key_heads, spec.gdn_key_dim, device="cuda").to(torch.bfloat16)
    u = torch.randn(*lead, n, hv, vd, device="cuda")
    log_p = -torch.rand(*lead, n, hv, device="cuda")
    if kind == "replay":  # the served commit as `bole bench kernels` runs it: gates fused, promises kept
        v, a, b = u.to(torch.bfloat16), log_p.to(torch.bfloat16), torch.randn_like(log_p).to(torch.bfloat16)
        A_log, dt_bias = (torch.stack([s.A_log] * layers), torch.stack([s.dt_bias] * layers)) if lead else \
            (s.A_log, s.dt_bias)

        def run_replay(config):
            pool = pool0.clone()

            def fn():
                kernels.tree_commit_replay_gated(pool, s.slots, k, v, a, b, A_log, dt_bias, s.parents, s.cu,
                                                 s.accepted, check_trees=False, max_nodes=nodes,
                                                 max_depth=s.max_depth, config=config)
            return fn, pool.clone
        return run_replay

    def run(config):
        pool = pool0.clone()

        def fn():
            kernels.tree_commit(pool, s.slots, k, u, log_p, s.parents, s.cu, s.accepted, check_trees=False,
                                config=config)
        return fn, pool.clone  # the state after one commit (timing commits again, in place)
    return run


def launch_floor() -> dict:
    import torch
    import triton

    from bole_cli.timing import time_graph, warm_gpu

    @triton.jit
    def empty(x):
        pass

    warm_gpu(torch)
    dummy = torch.empty(1, device="cuda")
    return {grid: time_graph(torch, [lambda g=grid: empty[(g,)](dummy)]) for grid in (1, 128, 1024)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel", nargs="?", choices=sorted(SITES))
    ap.add_argument("variants", nargs="*", help="names from --list")
    ap.add_argument("--cases", help=f"BxT[:chain], comma-separated (verify default {VERIFY_CASES}; "
                                    f"blocked {BLOCKED_CASES}; commit {COMMIT_CASES}; replay {REPLAY_CASES})")
    ap.add_argument("--layers", type=int, default=1, help="commit, replay: GDN layers in one launch")
    ap.add_argument("--accepted", choices=("int32", "int64"), default="int32",
                    help="commit, replay: accepted's dtype (the runtime's int64, SGLang's int32)")
    ap.add_argument("--config", default="", help="launch knobs for every kernel, e.g. BV=64,BK=32")
    ap.add_argument("--model", default="9b")
    ap.add_argument("--rep-ms", type=int, default=60)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--once", action="store_true", help="launch each kernel once, untimed")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--launch-floor", action="store_true")
    ap.add_argument("--source", metavar="VARIANT", choices=sorted(VARIANTS))
    args = ap.parse_args(argv)

    if args.source:
        print(edited_source(VARIANTS[args.source].site, VARIANTS[args.source].edits), end="")
        return
    if args.list or args.check:
        if args.check:
            import bole_cli.kernels  # noqa: F401  (picks the interpreter without CUDA)
        for name, variant in VARIANTS.items():
            if args.check:
                load_variant(name)
            kind = next(k for k, site in SITES.items() if site.launcher == variant.site.launcher)
            print(f"{name:10s} {kind:6s} {variant.about}")
        return
    if args.launch_floor:
        print("empty launch us by grid size:", launch_floor())
        return
    if args.kernel is None:
        ap.error("name a kernel (verify, blocked, commit or replay), or --list / --check / --launch-floor")
    if args.kernel == "decode":
        ap.error("decode variants are timed as the runtime calls the decode, beside SGLang's: "
                 "experiments/component_bench.py --parts gdn_decode --decode-variants NAMES")
    site = SITES[args.kernel]
    wrong = [v for v in args.variants if v not in VARIANTS or VARIANTS[v].site.launcher != site.launcher]
    if wrong:
        ap.error(f"not {args.kernel} variants: {wrong}")

    import torch
    import triton

    from bole_cli import kernels
    from bole_cli.catalog.models import resolve_model
    from bole_cli.timing import time_graph, warm_gpu

    spec = resolve_model(args.model)
    config = parse_config(args.config)
    shipped = getattr(importlib.import_module(site.source), site.attr)
    contenders = {"shipped": (site, shipped, {})}
    for name in args.variants:
        v = VARIANTS[name]
        kern = load_variant(name)
        contenders[name] = (v.site, WithConstexprs(kern, v.constexprs) if v.constexprs else kern, v.config)
    if not args.once:
        warm_gpu(torch)
    rows = []
    for batch, nodes, tree in parse_cases(args.cases or {"verify": VERIFY_CASES, "blocked": BLOCKED_CASES,
                                                                 "commit": COMMIT_CASES,
                                                                 "replay": REPLAY_CASES}[args.kernel]):
        run = case_runner(torch, kernels, args.kernel, spec, batch, nodes, tree, args.layers, args.accepted)
        row, ref = {"batch": batch, "nodes": nodes, "tree": tree, "layers": args.layers,
                    "accepted": args.accepted}, None
        for name, (at, kern, own) in contenders.items():
            fn, result = run({**config, **own} or None)
            with kernel_in_place(at, kern):
                fn()
                out = result()
                ref = out if ref is None else ref
                row[f"{name}_diff"] = rel(out, ref) if args.kernel in ("commit", "replay") \
                    else max(rel(a, b) for a, b in zip(out, ref))
                if not args.once:
                    row[f"{name}_us"] = time_graph(torch, [fn], rep_ms=args.rep_ms)
        torch.cuda.synchronize()
        rows.append(row)
        print(f"{args.kernel} B{batch:3d} T{nodes:3d} {tree:6s} L{args.layers:2d}  " + "  ".join(
            f"{n} {row.get(n + '_us', float('nan')):7.1f} us (diff {row[n + '_diff']:.1e})" for n in contenders),
            flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "command": "python " + " ".join(sys.argv),
                       "variants": {n: VARIANTS[n].about for n in args.variants}, "config": config,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
