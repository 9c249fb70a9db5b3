"""The verify's outputs against the bf16 rounding floor with tf32 emulated on the CPU: a
prediction of the served precision contract's output half before a device call.

Triton's interpreter computes a tf32 dot in float32, so on the CPU every precision looks
exact. sm_90's tensor cores take float32 operands of a tf32 dot with their 13 low mantissa
bits dropped (the PTX feeds them to mma / wgmma as they are, no cvt.rna), so here the
interpreter's dot is patched to truncate its float32 operands when the dot asks for tf32
(tf32x3 and ieee stay exact, as three tf32 products are to about float32), and its float32 ->
bf16 cast to round to nearest even as the GPU does. Reproduced the H200's 1.50x on 256-node
chains with strong decay (P-1) before the chain factors moved to tf32x3 (experiments/NOTES.md
"The chain kernel's factors"); a prediction, never a measurement of the contract.

    PYTHONPATH=. python experiments/tf32_emulation.py                  # the contract's cases
    PYTHONPATH=. python experiments/tf32_emulation.py --contract       # o and state, per implementation
    PYTHONPATH=. python experiments/tf32_emulation.py --smoke --out /tmp/e.json

Patches Triton 3.9's interpreter internals (InterpreterBuilder.create_dot, cast_impl): a
newer Triton may need the patch changed (the smoke test says so). Index: experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

CASES = [("chain", 16, 4, "strong"), ("chain", 64, 4, "strong"), ("random", 64, 4, "strong"),
         ("random", 32, 8, "mild"), ("random", 256, 2, "strong"), ("chain", 256, 2, "strong"),
         ("chain", 256, 2, "mild"), ("random", 256, 2, "mild")]
DECAYS = {"strong": (-3.0, 0.0), "mild": (-0.05, 0.0)}


_TF32 = {"on": False}  # the dots' emulation, switched per run; the cast's rounding always on


def emulate_tf32() -> None:
    """Patch the interpreter once: tf32 dots truncate float32 operands to tf32 while
    _TF32["on"], float32 -> bf16 casts round to nearest even (the interpreter's own does not)."""
    import numpy as np
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interp

    cast = interp.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f32 = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            return interp.TensorHandle(f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    interp.InterpreterBuilder.create_dot = truncating_dot(interp.InterpreterBuilder.create_dot, lambda: _TF32["on"])
    interp.InterpreterBuilder.cast_impl = cast_impl


def truncating_dot(dot, on=lambda: True):
    """The interpreter's create_dot with sm_90's tf32: float32 operands of a dot that asks for
    tf32 lose their 13 low mantissa bits while on() (tf32x3 and ieee stay exact). A test
    monkeypatches InterpreterBuilder.create_dot with it."""
    import numpy as np
    import triton.runtime.interpreter as interp

    def truncated(h):
        bits = np.ascontiguousarray(h.data, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return interp.TensorHandle(bits.view(np.float32), h.dtype.scalar)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if on() and str(input_precision).lower().endswith("tf32") and a.data.dtype == np.float32:
            a, b = truncated(a), truncated(b)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    return create_dot


def o_over_floor(tree: str, nodes: int, batch: int, decay: str, kdim: int, vdim: int, seed: int = 7) -> float:
    """The verify's output RMS error over the bf16 floor's, against float64, one case."""
    import torch

    from bole_cli.kernels import tree_verify
    from bole_cli.kernels.reference import tree_verify_ref
    from bole_cli.trees import pack_forest, random_tree

    gen = torch.Generator().manual_seed(seed)
    trees = [random_tree(seed * 100 + b, nodes, None if tree == "chain" else 8, 1, shape=tree)
             for b in range(batch)]
    forest = pack_forest(trees)
    parents, cu = (torch.tensor(x, dtype=torch.int32) for x in (forest.parents, forest.cu_seqlens))
    n, h, hv = forest.n_nodes, 1, 2
    lo, hi = DECAYS[decay]
    bf = torch.bfloat16
    q, k = (torch.randn(n, h, kdim, generator=gen).to(bf) for _ in range(2))
    v = torch.randn(n, hv, vdim, generator=gen).to(bf)
    g = lo + (hi - lo) * torch.rand(n, hv, generator=gen)
    beta = torch.rand(n, hv, generator=gen)
    state = torch.randn(batch, hv, vdim, kdim, generator=gen) * 0.05
    slots = torch.arange(batch, dtype=torch.int32)
    inputs = (q, k, v, g, beta, state, slots, parents, cu)
    ref = tree_verify_ref(*inputs).o
    got = tree_verify(*inputs).o.double()
    rms = (lambda a: float(a.pow(2).mean().sqrt()))
    return rms(got - ref) / rms(ref.to(bf).double() - ref)


# the contract's cases of one tile (bench.precision.CASES' trees up to 64 nodes; the 256-node
# ones take the big-tree kernels, where split is tf32x3), each at both decays
CONTRACT_CASES = [("chain", 16, 4), ("chain", 64, 4), ("random", 64, 4), ("random", 32, 16)]


def contract_rows(kdim: int, vdim: int, impls, cases=CONTRACT_CASES) -> list[dict]:
    """The precision contract's o and committed-state errors (bole_cli.bench.precision, as
    experiments/precision_contract.py measures them on the GPU) with tf32 emulated: per case,
    decay and implementation, o over the bf16 floor and the state's RMS relative error after
    one verify + commit."""
    from types import SimpleNamespace

    import torch

    from bole_cli.bench.precision import committed_reference, make_inputs, reference, rms, run_impl

    spec = SimpleNamespace(gdn_key_heads=1, gdn_value_heads=2, gdn_key_dim=kdim, gdn_value_dim=vdim)
    rows = []
    for tree, nodes, batch in cases:
        for decay in DECAYS:
            s = make_inputs(torch, spec, tree, nodes, batch, decay, 5 * nodes + batch, torch.float32, "cpu")
            o_ref, states = reference(torch, s)
            floor = rms(o_ref.to(torch.bfloat16), o_ref)
            for impl in impls:
                o, pool = run_impl(torch, impl, s, None)
                row = dict(tree=tree, nodes=nodes, batch=batch, decay=decay, impl=impl, kdim=kdim, vdim=vdim,
                           o_over_floor=rms(o, o_ref) / floor,
                           state_rms_single=rms(pool[s.slots.long()], committed_reference(torch, s, states)))
                rows.append(row)
                print(f"{tree:6s} {nodes:3d} x {batch:<2d} {decay:6s} {impl:7s}: o {row['o_over_floor']:.3f}x the "
                      f"floor, state {row['state_rms_single']:.2e}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kdim", type=int, default=128)
    ap.add_argument("--vdim", type=int, default=32, help="value columns (the error is per column; 32 is quick)")
    ap.add_argument("--smoke", action="store_true", help="one small chain, emulated and exact (a test)")
    ap.add_argument("--contract", action="store_true",
                    help="the contract's o and state errors per implementation (served, tf32, split, tf32x3)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    cases = [("chain", 64, 1, "strong")] if args.smoke else CASES
    kdim = 16 if args.smoke else args.kdim
    rows = []
    emulate_tf32()
    if args.contract:
        _TF32["on"] = True
        rows = contract_rows(kdim, args.vdim, ("served", "tf32", "split", "tf32x3"),
                             [("chain", 9, 2)] if args.smoke else CONTRACT_CASES)
        cases = []
    for c in cases:
        _TF32["on"] = False
        exact = o_over_floor(*c, kdim, args.vdim)
        _TF32["on"] = True
        row = dict(zip(("tree", "nodes", "batch", "decay"), c), kdim=kdim, vdim=args.vdim,
                   o_over_floor_tf32=o_over_floor(*c, kdim, args.vdim), o_over_floor_exact=exact)
        rows.append(row)
        print(f"{c[0]:6s} {c[1]:3d} x {c[2]} {c[3]:6s}: tf32 emulated {row['o_over_floor_tf32']:.3f}x the floor "
              f"(exact dots {row['o_over_floor_exact']:.3f}x)", flush=True)
    if args.out:
        doc = {"device": "cpu (Triton interpreter, tf32 emulated)", "command": "python " + " ".join(sys.argv),
               "rows": rows}
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
