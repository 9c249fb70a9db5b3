"""Compile time of SGLang 0.5.23's ReplaySSM ring verify kernel for sm_90, without a GPU (issue 15).

Why `bole bench kernels`' ring cells time out on a fresh machine: the kernel unrolls
`tl.static_range(BS)` loops over the window (BS = next_pow2(tokens)), so its compile grows
steeply with the chain. Run here (CPU, Triton's bundled ptxas): python experiments/ring_compile_times.py 2 8 16 32 64
"""
import importlib, time, sys, inspect
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from bole_cli.sglang.source import find_sglang_source
from bole_cli.sglang.isolation import isolated_sglang
root = find_sglang_source().package_root()
with isolated_sglang(root, ("sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode",)):
    m = importlib.import_module("sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode")
k = m.gdn_replayssm_spec_circular_kernel
params = [p.name for p in k.params]
const = {p.name for p in k.params if p.is_constexpr}
ptr_dt = dict(q="*bf16", k="*bf16", v="*bf16", a="*bf16", b="*bf16", A_log="*fp32", dt_bias="*fp32", o="*bf16",
              h0="*fp32", d_cache="*bf16", k_cache="*bf16", g_cache="*fp32", rawv_cache="*bf16", rawk_cache="*bf16",
              beta_cache="*fp32", query_start_loc="*i32", ssm_state_indices="*i32", replay_indices="*i32",
              write_pos="*i32", cache_base="*i32", is_flush_flags="*i8", scale="fp32")
H, HV, K, V = 16, 32, 128, 128
for D in map(int, sys.argv[1:]):
    L = max(16, 1 << (D - 1).bit_length())
    BS = max(4, triton.next_power_of_2(D)); BC = max(16, triton.next_power_of_2(L))
    cv = dict(stride_q_t=H*K, stride_k_t=H*K, stride_v_t=HV*V, stride_a_t=HV, stride_b_t=HV, stride_o_t=HV*V,
              stride_state_slot=HV*V*K, stride_d_slot=HV*L*V, stride_k_slot=H*L*K, stride_g_slot=HV*L,
              stride_rawv_slot=HV*L*V, stride_rawk_slot=H*L*K, stride_beta_slot=HV*L, stride_qsl=1, stride_indices=1,
              stride_replay_indices=1, H=H, HV=HV, K=K, V=V, BK=128, BV=64, BS=BS, BC=BC, NK=2, BKT=64,
              MAX_CACHE_LEN=L, SOFTPLUS_THRESHOLD=20.0, USE_QK_L2NORM_IN_KERNEL=True, STATE_FP32=True,
              STORE_EXACT_RAW=False, STORE_D_RESIDUAL=True, STORE_K_RESIDUAL=True, IS_FLUSH=False, NULL_BLOCK_ID=-1,
              DOT_PRECISION="tf32")
    sig = {p: ("constexpr" if p in const else ptr_dt[p]) for p in params}
    t = time.time()
    src = ASTSource(fn=k, signature=sig, constexprs={(params.index(n),): v for n, v in cv.items()})
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1, num_stages=2))
    print(D, "BS", BS, "BC", BC, f"{time.time()-t:.1f}s", out.metadata.shared if hasattr(out.metadata, "shared") else "", flush=True)
