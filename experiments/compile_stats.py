"""sm_90 compile statistics of the verify kernels without a GPU: registers, stack frame and
spill bytes, shared memory and barriers, from Triton's own compile for an sm_90 target and the
ptxas Triton ships. A proxy, not a timing: in I17-i the ranking of spill bytes of three
kernel forms matched their measured ranking on the H200 (experiments/NOTES.md, "Deferred
commit measured"); a code move that keeps every row here unchanged owes no re-timing.

    python experiments/compile_stats.py tile 16,128,32,128,2,2 [--variant v9] [--split-state]
    python experiments/compile_stats.py blocked 128,64,32,32,2,1 [--out FILE.json]
    python experiments/compile_stats.py chain-scan 256,64,32,16,4,1     # also chain-factors,
    python experiments/compile_stats.py levels 256,32,64,0,8,1          # levels-gram, commit
    python experiments/compile_stats.py replay 64,32,0,16,4,1 [--wdot ieee]  # TP: the path walk, VT: DP
    python experiments/compile_stats.py replay 16,16,0,16,1,1 [--row-stride arg]   # replay, commit too

Strides are arguments as a launch passes them (a 1 a constant, multiples of 16 marked so);
`--constant-strides` compiles them as constants, as every record before the tenth session was
(experiments/NOTES.md "The one-row projections and dependent launch": the replay commit 168
registers as launched, 96-128 with constant strides).

A spec is TP,BV,BK,VT,warps,stages (the other kernels: BC in VT's place); the shapes are a catalogue
model's GDN layer (--model, default 9b), bf16 activations, float32 state, gated, L2 norms.
Index of experiments: experiments/README.md.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

from kernel_variants import SITES, VARIANTS, load_variant

from bole_cli.limits import REPLAY_GATES_FIRST_PMAX

POINTERS = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "g": "*bf16", "beta": "*bf16", "A_log": "*fp32",
            "dt_bias": "*fp32", "state": "*fp32", "state_idx": "*i32", "parents": "*i32", "cu": "*i32",
            "o": "*bf16", "u": "*fp32", "log_p": "*fp32", "scale": "fp32", "n_slots": "i32", "n_rows": "i32",
            "n_hv": "i32",
            "ys": "*fp32", "kk_ws": "*fp32", "qk_ws": "*fp32", "bits_ws": "*i64", "fu": "*fp32", "fo": "*fp32",
            "accepted": "*i32", "n_req": "i32", "ancestors": "*i32", "kk": "*fp32", "qk": "*fp32",
            "n_h": "i32", "xs": "*fp32", "gram_kk": "*fp32", "gram_qk": "*fp32"}
# the other kernels (name: module, attribute): their specs say TP,BV,BK,BC,warps,stages the same way
KERNELS = {"chain-factors": ("bole_cli.kernels.tree_verify_chain", "chain_factors_kernel"),
           "chain-scan": ("bole_cli.kernels.tree_verify_chain", "chain_scan_kernel"),
           "commit": ("bole_cli.kernels.tree_commit", "_tree_commit_kernel"),
           "replay": ("bole_cli.kernels.tree_commit_replay", "_tree_commit_replay_kernel"),
           "parts": ("bole_cli.kernels.tree_verify_parts", "parts_kernel"),
           "levels-gram": ("bole_cli.kernels.tree_verify_levels", "levels_gram_kernel"),
           "levels": ("bole_cli.kernels.tree_verify_levels", "tree_levels_kernel")}


def layer_shape(model: str) -> tuple[dict, dict]:
    """(the kernels' shape constexprs, the contiguous tensors' strides) of a catalogue model's
    GDN layer."""
    from bole_cli.catalog.models import resolve_model

    spec = resolve_model(model)
    h, hv, kd, vd = spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim
    shape = dict(GROUP=hv // h, K=kd, V=vd, KP=1 << (kd - 1).bit_length())
    strides = dict(s_qn=h * kd, s_qh=kd, s_kn=h * kd, s_kh=kd, s_vn=hv * vd, s_vh=vd, s_gn=hv, s_gh=1, s_bn=hv,
                   s_bh=1, s_sn=hv * vd * kd, s_sh=vd * kd, s_sv=kd, s_on=hv * vd, s_oh=vd, s_un=hv * vd, s_uh=vd,
                   s_ln=hv, s_yn=hv * vd, s_yh=vd, s_xn=hv * vd, s_xh=vd)
    return shape, strides


def ptxas_path() -> str:
    """The ptxas Triton ships (the newest of its binaries, which knows sm_90a)."""
    import triton

    found = sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*")))
    if not found:
        raise SystemExit("no ptxas in this Triton install (backends/nvidia/bin)")
    return found[-1]


def compile_stats(kernel, spec: tuple[int, ...], blocked: bool, model: str = "9b",
                  knobs: dict | None = None, constant_strides: bool = False) -> dict:
    """knobs: a launch-knob variant's constexprs (e.g. SPLIT). The strides are arguments, as a
    launch passes them (Triton specialises a 1 to a constant and marks multiples of 16), unless
    constant_strides: every stride a constant, as this script compiled until the tenth session
    (the records before it; register counts then lower where a kernel keeps addresses)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bole_cli.kernels.tree_commit_replay import const_row_stride  # (after main's TRITON_INTERPRET=0)

    tp, bv, bk, vt, warps, stages = spec
    shape, strides = layer_shape(model)
    knobs = knobs or {}
    split = bool(knobs.get("SPLIT_STATE", 0))  # the one-tile verify at the "split" precision
    constexprs = dict(shape, TP=tp, BV=bv, BK=bk, USE_L2NORM=True, PRECISION="tf32", GATED=True, GRAM16=True,
                      STATE_PRECISION="tf32x3" if split else "tf32", SPLIT_STATE=split,
                      STORE_FACTORS=bool(knobs.get("STORE_FACTORS", 1)))
    constexprs.update(dict(DP=16, DW=8, RB=64, BR=64, BG=64, ROLES=7))  # (the commit's, the level kernels', the parts')
    # the replay commit: TP is its path walk's width, VT its pass (DP), WDOT a knob
    constexprs.update(dict(PMAX=tp, EXACT_KEYS=True, WDOT=knobs.get("WDOT", "split"), RELOAD=bool(knobs.get("RELOAD", 1)),
                           WALK=tp, GATES_FIRST=tp >= REPLAY_GATES_FIRST_PMAX,  # (its launcher's, one kernel)
                           # its row stride as launched for a TP-node walk, or an argument
                           SV=0 if knobs.get("ROW_STRIDE") == "arg" else const_row_stride(tp, strides["s_sv"])))
    constexprs.update(dict(BC=vt, NW=tp // 64, DS=16, REMAINDER=False, SPLIT=bool(knobs.get("SPLIT", 0))) if blocked
                      else dict(VT=vt))
    params = [p.name for p in kernel.params]
    const = {p.name for p in kernel.params if p.is_constexpr}
    strides.update({f"s_{x}l": 0 for x in "skulvgba"}, s_sl=0)  # (the commits' layer strides)
    fixed = strides if constant_strides else {n: v for n, v in strides.items() if v == 1}
    signature = {p: "constexpr" if p in const or p in fixed else ("i32" if p in strides else POINTERS[p])
                 for p in params}
    values = dict(constexprs, **fixed)
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params)
             if p not in const and p not in fixed and (p in POINTERS and POINTERS[p].startswith("*")
                                                       or p in strides and strides[p] % 16 == 0)}
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(params.index(n),): v for n, v in values.items() if n in params}, attrs=attrs)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptx = out.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        run = subprocess.run([ptxas_path(), "-v", "-arch=sm_90a", path, "-o", os.path.join(tmp, "kernel.cubin")],
                             capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", run.stderr)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", run.stderr)
    if not (regs and frame):
        raise SystemExit(f"ptxas gave no statistics: {run.stderr[-400:]}")
    return {"registers": int(regs.group(1)), "stack": int(frame.group(1)), "spill_stores": int(frame.group(2)),
            "spill_loads": int(frame.group(3)), "shared": out.metadata.shared, "bar_sync": ptx.count("bar.sync")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel", choices=("tile", "blocked", *KERNELS))
    ap.add_argument("specs", nargs="+", help="TP,BV,BK,VT,warps,stages (blocked: BC for VT)")
    ap.add_argument("--variant", help="a kernel_variants.py name of this kernel's site")
    ap.add_argument("--model", default="9b", help="catalogue model whose GDN layer shape to compile for")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--wdot", default="split", help="the replay commit's WDOT knob")
    ap.add_argument("--reload", type=int, default=1, help="the replay commit's RELOAD knob")
    ap.add_argument("--split-state", action="store_true", help="the one-tile verify at the split precision")
    ap.add_argument("--row-stride", choices=("launch", "arg"), default="launch",
                    help="the replay commit's state row stride: as launched for a TP-node walk (a constant "
                         "up to limits.REPLAY_CONST_ROW_PATH), or an argument at every walk")
    ap.add_argument("--constant-strides", action="store_true",
                    help="every stride a compile-time constant (the records before the tenth session)")
    args = ap.parse_args(argv)
    if args.split_state and args.kernel != "tile":
        raise SystemExit("--split-state: only the tile kernel has the split precision")
    site = SITES.get({"tile": "verify"}.get(args.kernel, args.kernel))  # a kernel with variants, or None
    if args.variant and (args.variant not in VARIANTS or VARIANTS[args.variant].site != site):
        names = sorted(n for n, v in VARIANTS.items() if v.site == site)
        raise SystemExit(f"--variant: {args.variant!r} is not a {args.kernel} variant ({', '.join(names) or 'none'})")
    try:
        specs = [tuple(int(x) for x in s.split(",")) for s in args.specs]
    except ValueError:
        raise SystemExit("specs are comma-separated integers") from None
    if any(len(s) != 6 for s in specs):
        raise SystemExit("a spec has six numbers: TP,BV,BK,VT,warps,stages")
    os.environ["TRITON_INTERPRET"] = "0"  # a real compile for the sm_90 target, with or without a GPU
    if site is None:
        kernel = getattr(importlib.import_module(KERNELS[args.kernel][0]), KERNELS[args.kernel][1])
    else:
        kernel = load_variant(args.variant) if args.variant else getattr(importlib.import_module(site.source), site.attr)
    table = []
    for spec in specs:
        stats = compile_stats(kernel, spec, args.kernel != "tile", args.model,
                              VARIANTS[args.variant].config if args.variant else
                              {"WDOT": args.wdot, "RELOAD": args.reload, "SPLIT_STATE": args.split_state,
                               "ROW_STRIDE": args.row_stride},
                              args.constant_strides)
        name = args.variant or ("split-state" if args.split_state else "shipped")
        table.append(dict(kernel=args.kernel, variant=name, model=args.model, spec=list(spec), **stats))
        print(f"{args.kernel} {name} {','.join(map(str, spec))}: "
              f"{stats['registers']} regs, stack {stats['stack']}, spill st/ld {stats['spill_stores']}/"
              f"{stats['spill_loads']} B, smem {stats['shared']}, bar.sync {stats['bar_sync']}", flush=True)
    if args.out:
        import triton

        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"target": "sm_90a (compiled, not run)", "triton": triton.__version__, "ptxas": ptxas_path(),
                       "strides": "constant" if args.constant_strides else "arguments",
                       "command": "python " + " ".join(sys.argv), "rows": table}, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
