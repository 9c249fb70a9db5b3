"""Launches a runtime step makes, counted on the CPU (no GPU): a decode, a verify's metadata,
forward and commit, by kind and per layer, for the runtime's variants. A check of the
launch budget between device calls (experiments/NOTES.md "The launches around the
projections fused"), never a timing.

Counted: every aten op that launches a kernel (torch's dispatch mode; views and
allocations excluded), every Triton launch (the interpreter's grid calls), a compiled
`runtime.fusion` piece as one launch (what inductor makes of it on the GPU is usually one
kernel, sometimes more: R-4's profile is the measurement). cuBLAS's split-K reductions are
not counted, nor the attention's chunk merge where the tiny model's short cache needs one
chunk and a real one (thousands of keys) two or more: one launch an attention layer more. The commit's KV move runs
as kernels.kv_compact, as the GPU runtime does.

    PYTHONPATH=. python experiments/launch_count.py --out /tmp/launches.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

VARIANTS = {  # name: HybridModel switches (production: the CUDA default but its one-row skinny in_proj and LM head)
    "pieces": dict(cache_kernel=True, attention_in_kernel=False, kv_compact_kernel=False, skinny_mm=False),
    "production": dict(cache_kernel=True, attention_in_kernel=True, kv_compact_kernel=True, skinny_mm=False),
    "skinny": dict(cache_kernel=True, attention_in_kernel=True, kv_compact_kernel=True, skinny_mm=True),
}
NO_LAUNCH = {"view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "slice", "select", "unsqueeze",
             "squeeze", "expand", "alias", "detach", "unbind", "split", "split_with_sizes", "chunk", "reshape",
             "narrow", "_reshape_alias", "lift_fresh", "empty", "empty_like", "empty_strided", "unflatten",
             "flatten", "diagonal", "view_as", "resolve_conj", "resolve_neg", "_local_scalar_dense", "sym_size",
             "sym_stride", "dim", "size", "stride", "expand_as"}
PIECES = ("add_rms", "swiglu", "attn_in", "gated_out", "gated_norm", "mtp_in")


class Counter:
    """Counts launches while active; nested launches (inside a counted one) are not counted."""

    def __init__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        import triton.runtime.interpreter as interp

        self.counts, self.depth = collections.Counter(), 0
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if outer.depth == 0 and name not in NO_LAUNCH:
                    outer.counts["torch " + name] += 1
                return func(*args, **(kwargs or {}))

        if not hasattr(interp, "GridExecutor"):
            raise SystemExit("error: this Triton's interpreter has no GridExecutor (the launch hook); "
                             "update experiments/launch_count.py")
        self.mode, self.torch, self.interp = Mode(), torch, interp
        self._orig = interp.GridExecutor.__call__

        def launch(executor, *a, **k):
            if outer.depth == 0:
                outer.counts["triton " + executor.fn.__name__] += 1
            outer.depth += 1
            try:
                return outer._orig(executor, *a, **k)
            finally:
                outer.depth -= 1

        interp.GridExecutor.__call__ = launch

    def piece(self, fn, name):
        def counted(*a, **k):
            if self.depth == 0:
                self.counts["compiled " + name] += 1
            self.depth += 1
            try:
                return fn(*a, **k)
            finally:
                self.depth -= 1
        return counted

    def take(self) -> dict:
        out = dict(self.counts)
        self.counts.clear()
        return out


def count_variant(counter: Counter, name: str, layers: int, batch: int, kv: int, tokens: int) -> dict:
    import torch

    from bole_cli.catalog.models import tiny_spec
    from bole_cli.runtime import HybridModel
    from bole_cli.runtime import fusion
    from bole_cli.runtime.tree_metadata import TreeInputs, refill_tree
    from bole_cli.runtime.timer import tree_sizes
    from bole_cli.trees import pack_forest, random_tree

    spec = tiny_spec(layers=layers)
    model = HybridModel(spec, "cpu", torch.float32, seed=0, gdn_backend="kernels", compile=False, **VARIANTS[name])
    for piece in PIECES:
        setattr(model.fuse, piece, counter.piece(getattr(model.fuse, piece), piece))
    rms = fusion.rms
    fusion.rms = counter.piece(rms, "rms")
    try:
        cache = model.new_cache(batch, kv + tokens + 8, random_fill=True)
        cache.kv_lens[:] = [kv] * batch
        trees = [random_tree(11 + b, n, 8) for b, n in enumerate(tree_sizes(batch, tokens))]
        forest = pack_forest(trees)
        toks = torch.randint(spec.vocab, (forest.n_nodes,), generator=torch.Generator().manual_seed(0))
        tb = model.prepare_verify(cache, forest, toks, list(range(batch)))
        inputs = TreeInputs(tb)
        inputs.load([int(p) for p in forest.parents], toks.tolist(), [kv] * batch)
        accepted = torch.tensor([max(range(t.n_nodes), key=lambda i: t.depths[i]) for t in trees])
        db = model.prepare_decode(cache, list(range(batch)), list(range(batch)))
        out = {}
        with torch.inference_mode(), counter.mode:
            refill_tree(tb, inputs.parents, inputs.tokens, inputs.base, model.rope, kernel=True)
            out["verify_metadata"] = counter.take()
            res = model.forward_verify(cache, tb)
            out["verify_forward"] = counter.take()
            model.commit_device(cache, res, accepted)
            out["verify_commit"] = counter.take()
            model.forward_decode(cache, db)
            out["decode_forward"] = counter.take()
    finally:
        fusion.rms = rms
    return {step: {"launches": sum(c.values()), "per_layer": round(sum(c.values()) / layers, 2),
                   "by_kind": dict(sorted(c.items(), key=lambda kv: -kv[1]))} for step, c in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--layers", type=int, default=8, help="the tiny model's layers (three GDN to one attention)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv", type=int, default=64)
    ap.add_argument("--tree-tokens", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        raise SystemExit(f"error: --variants: unknown {bad} (known: {', '.join(VARIANTS)})")
    import torch

    counter = Counter()
    doc = {"device": "cpu (counts only)", "versions": {"torch": torch.__version__},
           "command": "python " + " ".join(sys.argv), "layers": args.layers,
           "batch": args.batch, "tree_tokens": args.tree_tokens, "variants": {}}
    for name in args.variants.split(","):
        doc["variants"][name] = count_variant(counter, name, args.layers, args.batch, args.kv, args.tree_tokens)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.out)
    steps = ("decode_forward", "verify_metadata", "verify_forward", "verify_commit")
    print(f"{'variant':11s}" + "".join(f"{s:>17s}" for s in steps) + "   (launches; per layer)")
    for name, v in doc["variants"].items():
        print(f"{name:11s}" + "".join(f"{v[s]['launches']:>10d} ({v[s]['per_layer']:4.1f})" for s in steps))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
