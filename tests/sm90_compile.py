"""Compile kernels for the H200's sm_90 on a machine without a GPU (Triton's compiler and the
ptxas its wheel ships): what the interpreter never checks (loop-carried types, layouts, the
register and shared-memory budget) fails here as it would on the device. Run by
tests/test_sm90_compile.py in a subprocess (the interpreter must be off before triton is
imported); prints one line a compile and exits 1 if any failed."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


def compile_sm90(kernel, pointers: dict, scalars: dict, constexprs: dict, num_warps: int = 4,
                 num_stages: int = 1):
    """pointers: name -> Triton pointer type ("*bf16"); scalars: name -> type (default i32)."""
    params = [p.name for p in kernel.params]
    sig = {}
    for p in kernel.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        else:
            sig[p.name] = pointers.get(p.name) or scalars.get(p.name, "i32")
    src = ASTSource(fn=kernel, signature=sig, constexprs={(params.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps,
                                                                               num_stages=num_stages))


def cases():
    from bole_cli.kernels.skinny_mm import _skinny_mm_kernel
    from bole_cli.kernels.tree_metadata import _tree_metadata_kernel
    from bole_cli.kernels.tree_verify_chain import chain_scan_kernel

    for idt, bias, kv_used, tp, dp, group in (("i32", "fp32", True, 32, 8, 4), ("i64", "bf16", False, 256, 32, 1),
                                             ("i64", None, False, 2, 1, 2)):
        ptr = {n: f"*{idt}" for n in ("parents_in", "tokens_in", "base_in")}
        ptr.update({n: "*i64" for n in ("tokens", "base", "depths", "positions", "kv_pos", "path_table",
                                        "parent_rows", "sglang_parents")})
        ptr.update(cu="*i32", parents="*i32", layer_parents="*i32", kv_used="*i32" if kv_used else "*i64",
                   rope_cos="*fp32", rope_sin="*fp32", cos="*fp32", sin="*fp32",
                   tree_bias=f"*{bias}" if bias else "*fp32")
        consts = dict(HALF=32, HP=32, TP=tp, DP=dp, BR=min(32, tp), G=group, HAS_KV_USED=kv_used,
                      HAS_BIAS=bias is not None)
        yield f"tree_metadata {idt} bias={bias} T={tp} D={dp} G={group}", _tree_metadata_kernel, ptr, {}, consts, 4, 1
    for dtype, bm, split, ieee in (("bf16", 16, 1, False), ("bf16", 64, 4, False), ("fp32", 16, 2, True)):
        ptr = dict(x=f"*{dtype}", w=f"*{dtype}", y=f"*{dtype}", part="*fp32", counters="*i32")
        consts = dict(BM=bm, BN=32, BK=128, SPLIT=split, IEEE=ieee)
        yield f"skinny_mm {dtype} BM={bm} SPLIT_K={split}", _skinny_mm_kernel, ptr, {}, consts, 4, 4
    for exact in (True, False):
        ptr = dict(q="*bf16", k="*bf16", v="*bf16", g="*bf16", beta="*bf16", A_log="*fp32", dt_bias="*fp32",
                   state="*fp32", state_idx="*i32", parents="*i32", cu="*i32", o="*bf16", u="*fp32", fu="*fp32",
                   fo="*fp32")
        consts = dict(GROUP=2, K=128, V=128, KP=128, BC=16, BV=64, TP=256, DS=16, USE_L2NORM=True,
                      PRECISION="tf32", GATED=True, EXACT_CARRY=exact)
        yield f"chain_scan EXACT_CARRY={exact}", chain_scan_kernel, ptr, {"scale": "fp32"}, consts, 4, 1


def main() -> int:
    failed = 0
    for name, kernel, ptr, scalars, consts, warps, stages in cases():
        try:
            out = compile_sm90(kernel, ptr, scalars, consts, warps, stages)
            print(f"ok   {name}: {out.metadata.shared} B shared")
        except Exception as exc:  # noqa: BLE001 - each failure named, then the exit status
            failed += 1
            print(f"FAIL {name}: {str(exc)[-400:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
