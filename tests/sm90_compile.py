"""Compile kernels for the H200's sm_90 on a machine without a GPU (Triton's compiler and the
ptxas its wheel ships): what the interpreter never checks (loop-carried types, layouts, the
shared-memory budget) fails here as it would on the device. Run by
tests/test_sm90_compile.py in a subprocess (the interpreter must be off before triton is
imported); prints one line a compile and exits 1 if any failed."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


SHARED_LIMIT = 227 * 1024  # an sm_90 block's shared memory (the H200's)


def compile_sm90(kernel, pointers: dict, scalars: dict, constexprs: dict, num_warps: int = 4,
                 num_stages: int = 1, divisible: tuple = ()):
    """pointers: name -> Triton pointer type ("*bf16"); scalars: name -> type (default i32).
    Pointers, strides (s_*) and the `divisible` ints carry the 16-divisibility a real launch's
    arguments get, so the loads pipeline and the shared memory is what the device allocates."""
    params = [p.name for p in kernel.params]
    sig, attrs = {}, {}
    for i, p in enumerate(kernel.params):
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        else:
            sig[p.name] = pointers.get(p.name) or scalars.get(p.name, "i32")
            if p.name in pointers or p.name.startswith("s_") or p.name in divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=sig, constexprs={(params.index(k),): v for k, v in constexprs.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps,
                                                                               num_stages=num_stages))


def cases():
    from bole_cli.kernels.gdn_decode import _gdn_decode_kernel
    from bole_cli.kernels.skinny_mm import _skinny_mm_kernel

    # the fused GDN decode with each head over 4 programs: the last to arrive (an atomic
    # count) normalises the head (9B's shapes)
    ptr = {n: "*bf16" for n in ("x", "conv_state", "conv_w", "conv_b", "a", "b", "z", "norm_w", "o")}
    ptr.update(A_log="*fp32", dt_bias="*fp32", state="*fp32", state_idx="*i64", qk="*fp32", ss_part="*fp32",
               counters="*i32")
    for split, warps in ((1, 8), (4, 2), (8, 2), (16, 1)):  # a head over 1-16 programs (the rule's 4 x 2, 8 x 2)
        yield (f"gdn_decode value_split={split} warps={warps}", _gdn_decode_kernel, ptr, {"eps": "fp32"},
               dict(S_SV=128, H=16, GROUP=2, K=128, V=128, BK=128, BV=128 // split, VP=128, VS=split, VSP=split,
                    W=4, WP=4, HAS_BIAS=False, NORM=True), warps, 1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))
    import l2_prefetch_bench as l2  # an experiment's inline PTX must assemble before a device call

    for bulk, step in ((True, l2.CHUNK), (False, l2.LINE)):
        yield (f"l2_prefetch bulk={bulk}", l2.l2_prefetch_kernel, {"t": "*bf16"}, {"n_bytes": "i64", "steps": "i32"},
               dict(BULK=bulk, BLOCK=l2.BLOCK, STEP=step), l2.BLOCK // 32, 1)
    from bole_cli.kernels.tree_metadata import _tree_metadata_kernel
    from bole_cli.kernels.tree_verify_chain import chain_factors_kernel, chain_scan_kernel

    for idt, bias, kv_used, tp, dp, group in (("i32", "fp32", True, 32, 8, 4), ("i64", "bf16", False, 256, 32, 1),
                                             ("i64", None, False, 2, 1, 2)):
        ptr = {n: f"*{idt}" for n in ("parents_in", "tokens_in", "base_in")}
        ptr.update({n: "*i64" for n in ("tokens", "base", "depths", "positions", "kv_pos", "path_table",
                                        "parent_rows", "sglang_parents")})
        ptr.update(cu="*i32", parents="*i32", layer_parents="*i32", kv_used="*i32" if kv_used else "*i64",
                   rope_cos="*fp32", rope_sin="*fp32", cos="*fp32", sin="*fp32",
                   tree_bias=f"*{bias}" if bias else "*fp32")
        consts = dict(HALF=32, HP=32, TP=tp, DP=dp, BR=min(32 if tp < 128 else 16, tp), G=group, HAS_KV_USED=kv_used,
                      HAS_BIAS=bias is not None)
        yield f"tree_metadata {idt} bias={bias} T={tp} D={dp} G={group}", _tree_metadata_kernel, ptr, {}, consts, 4, 1
    from bole_cli.kernels.configs import launch_config

    # fused: "" none, "ng" add + norm + SwiGLU, "n" add + norm, "gate" x * sigmoid(gate), "head" the
    # GDN output's per-head norm (G 128)
    from bole_cli.kernels.skinny_mm import _stages

    for dtype, m, (n, k), fused in (("bf16", 1, (12352, 4096), ""), ("bf16", 64, (4096, 12288), ""),
                                    ("fp32", 16, (4096, 4096), ""), ("bf16", 1, (24576, 4096), "ng"),
                                    ("bf16", 64, (12352, 4096), "ng"), ("bf16", 16, (1024, 2560), "n"),
                                    ("bf16", 1, (4096, 4096), "gate"), ("bf16", 32, (4096, 4096), "head"),
                                    ("fp32", 64, (4096, 4096), "gate"), ("fp32", 64, (4096, 4096), "head")):
        cfg = launch_config("skinny_mm", {"M": m, "N": n, "K": k, "SMS": 132})  # the rule's launches
        ptr = dict(x=f"*{dtype}", w=f"*{dtype}", y=f"*{dtype}", part="*fp32", counters="*i32", res=f"*{dtype}",
                   norm_w=f"*{dtype}", x_sum=f"*{dtype}", ss_part="*fp32", aux=f"*{dtype}")
        bn = max(16, cfg["BN"] // 2) if fused == "ng" else cfg["BN"]  # the launcher's glu halves
        consts = dict(BM=max(16, triton.next_power_of_2(m)), BN=bn, BK=cfg["BK"], SPLIT=cfg["SPLIT_K"],
                      IEEE=dtype == "fp32", NORM=fused in ("n", "ng"), RESID=fused in ("n", "ng"), GLU=fused == "ng",
                      GATE=fused == "gate", HEAD=fused == "head", G=256 if fused == "gate" else 128)
        tiles = 1 + (fused in ("n", "ng")) + (fused in ("gate", "head"))  # the launcher's stage cap
        stages = _stages(cfg["num_stages"], consts["BM"], bn * (2 if fused == "ng" else 1), cfg["BK"],
                         4 if dtype == "fp32" else 2, tiles)
        yield (f"skinny_mm {dtype} M={m} N={n} K={k} fused={fused or '-'} {cfg} stages={stages}", _skinny_mm_kernel,
               ptr, {"eps": "fp32"}, consts, cfg["num_warps"], stages, ("N", "K", "k_slice"))
    from bole_cli.kernels.attention_in import _attention_in_kernel

    for hq, hk, dh, half, k_out in ((16, 4, 256, 32, False), (24, 4, 256, 32, True)):  # 9B decode, 27B verify
        ptr = dict(proj="*bf16", q_norm="*bf16", k_norm="*bf16", cos="*fp32", sin="*fp32", slots="*i64",
                   positions="*i64", q_out="*bf16", k_cache="*bf16", v_cache="*bf16", k_out="*bf16")
        consts = dict(HQ=hq, HK=hk, DH=dh, DP=dh, HALF=half, K_OUT=k_out)
        yield (f"attention_in HQ={hq} HK={hk} D={dh} k_out={k_out}", _attention_in_kernel, ptr, {"eps": "fp32"},
               consts, 2, 1)
    from bole_cli.kernels.cache_attention import (FEW_ROWS_LAUNCH, FULL_LAUNCH, MANY_ROWS_LAUNCH,
                                                  ONE_TILE_ROWS_LAUNCHES, _cache_attention_merge,
                                                  _cache_attention_part)

    ptr = dict(q="*bf16", k_cache="*bf16", v_cache="*bf16", slots="*i64", used="*i64", o_part="*fp32",
               m_part="*fp32", l_part="*fp32", out="*bf16", lse="*fp32", tree_bias="*fp32", tree_cu="*i32")
    for tree, final, (keys, warps, stages, _, _, rows) in ((True, False, FEW_ROWS_LAUNCH), (True, True, FEW_ROWS_LAUNCH),
                                                           (False, False, FEW_ROWS_LAUNCH),
                                                           (True, False, MANY_ROWS_LAUNCH),
                                                           (True, False, FULL_LAUNCH),
                                                           *((True, False, one) for _, one in ONE_TILE_ROWS_LAUNCHES),
                                                           *((False, False, one) for _, one in ONE_TILE_ROWS_LAUNCHES),
                                                           *((True, True, one) for _, one in ONE_TILE_ROWS_LAUNCHES)):
        # the rule's launches (a drafter level takes no tree; one chunk is final)
        yield (f"cache_attention_part tree={tree} final={final} BL={keys} BR={rows} warps={warps} stages={stages}",
               _cache_attention_part, ptr, {"scale": "fp32"},
               dict(H=4, D=256, BD=256, BR=rows, BL=keys, FINAL=final, TREE=tree, SIZES=True), warps, stages)
    yield ("cache_attention_merge 64 chunks", _cache_attention_merge, ptr, {}, dict(H=4, D=256, BD=256, NSP=64, SB=16),
           4, 1)
    from bole_cli.kernels.kv_compact import _kv_compact_kernel

    ptr = dict(k_cache="*bf16", v_cache="*bf16", slots="*i64", base="*i64", accepted="*i64", cu="*i32",
               path_table="*i64")
    yield "kv_compact D=256 depth=9", _kv_compact_kernel, ptr, {}, dict(H=4, D=256, BD=256, DEPTH=9), 1, 1
    from bole_cli.kernels.pending_chain import _pending_advance_kernel, _pending_place_kernel

    rows = {name: "*bf16" for name in ("q", "k", "v", "a", "b", "sq", "sk", "sv", "sa", "sb")}
    yield ("pending_place 9B", _pending_place_kernel, dict(rows, pending="*i32", rows="*i64"), {},
           dict(C=2, W=16, WQK=2048, WV=4096, WG=32, BQK=2048, BV=4096, BG=32), 4, 1)
    yield ("pending_advance", _pending_advance_kernel, dict(pending="*i32", accepted="*i32", fold="*i32"), {},
           dict(C=2, W=16, BLOCK=1024), 4, 1)
    from bole_cli.kernels.draft_topk import CHUNK, _chunk_topk_kernel, _merge_topk_kernel

    topk = dict(logits="*bf16", cand_val="*fp32", cand_id="*i32", token_map="*i64", out="*i64")
    for k, kp, nc in ((1, 1, 64), (5, 8, 512), (16, 16, 1024)):  # 248k logits: 61 chunks' candidates
        yield (f"draft_topk chunk k={k}", _chunk_topk_kernel, topk, {}, dict(K=k, KP=kp, CHUNK=CHUNK), 8, 1)
        yield (f"draft_topk merge k={k} mapped", _merge_topk_kernel, topk, {}, dict(K=k, KP=kp, NC=nc, MAPPED=True),
               4, 1)
    chain = dict(q="*bf16", k="*bf16", v="*bf16", g="*bf16", beta="*bf16", A_log="*fp32", dt_bias="*fp32",
                 state="*fp32", state_idx="*i32", parents="*i32", cu="*i32", o="*bf16", u="*fp32", fu="*fp32",
                 fo="*fp32", log_p="*fp32")
    shape = dict(GROUP=2, K=128, KP=128, BC=16, TP=256, DS=16, USE_L2NORM=True, GATED=True)
    yield ("chain_scan tf32", chain_scan_kernel, chain, {"scale": "fp32"},
           dict(shape, V=128, BV=64, PRECISION="tf32"), 4, 1)
    yield ("chain_factors tf32x3", chain_factors_kernel, chain, {"scale": "fp32"},
           dict(shape, PRECISION="tf32x3"), 4, 1)


def main() -> int:
    failed = 0
    for name, kernel, ptr, scalars, consts, warps, stages, *divisible in cases():
        try:
            out = compile_sm90(kernel, ptr, scalars, consts, warps, stages, *divisible)
            if out.metadata.shared > SHARED_LIMIT:
                raise RuntimeError(f"{out.metadata.shared} B of shared memory; an sm_90 block has {SHARED_LIMIT}")
            print(f"ok   {name}: {out.metadata.shared} B shared")
        except Exception as exc:  # noqa: BLE001 - each failure named, then the exit status
            failed += 1
            print(f"FAIL {name}: {str(exc)[-400:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
