"""Closed-form tree verify for long chains (more than CHAIN_KERNEL_DEPTH nodes; v13, experiments/README.md I17-l):
chunks of BC nodes in order with the state carried in registers, as a chunked recurrence
does (docs/design.md §2 on one path). Each chunk costs one chunk's work, where the blocked
kernel pairs it with every earlier chunk. Every other request (shorter chains, branching
trees, a slot outside the pool, a tree larger than TP) is left to the blocked kernel,
launched after these two (tree_verify.py). Measured: experiments/NOTES.md "Big trees".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.kernels.jit_math import gate_params, inverse_by_blocks, is_long_chain, request_span, row_gates
from bole_cli.kernels.types import VerifyArgs


# A chain's chunk factors need no state, so they are built first for every (request, value
# head, chunk) at once, as chunked recurrences do (the WY form of fla's chunk kernels; v12,
# which built them inside the dependent loop, was 1.07-1.44x slower: NOTES.md):
#
#     Fu_c = (I + G_cc)^-1 D_beta        Fo_c = C_cc Fu_c          (chain_factors_kernel)
#
# and the scan then costs three products on its critical path a chunk (chain_scan_kernel):
#
#     Z_c = V_c - D_Pc K_c S_c^T,   U_c = Fu_c Z_c,   O_c = D_Pc Q_c S_c^T + Fo_c Z_c,
#     S_(c+1) = P_last S_c + sum_j exp(logP_last - logP_j) k_j u_j^T
#
# with P relative to the chunk's start. Fu and Fo are [BC, BC] float32 a chunk and value
# head (scratch: chain_scratch_shape). The chunk's inverse merges diagonal blocks, exact at
# any depth (jit_math.inverse_by_blocks). Measured: experiments/NOTES.md "Big trees".


@triton.jit
def _unit_rows(x, rows_g, rmask, h, s_xn, s_xh, offs_k, kmask, scale, USE_L2NORM: tl.constexpr):
    """A chunk's rows of q or k [BC, KP] as loaded (16-bit stays 16-bit: fewer live
    registers) and the factor that makes them unit (times `scale`) when USE_L2NORM; the
    caller applies it where it is cheapest."""
    xr = tl.load(x + rows_g[:, None] * s_xn + h * s_xh + offs_k[None, :], mask=rmask[:, None] & kmask[None, :],
                 other=0.0)
    if USE_L2NORM:
        xc = xr.to(tl.float32)
        inv = scale / tl.sqrt(tl.sum(xc * xc, axis=1) + 1e-6)
    else:
        inv = tl.sum(xr.to(tl.float32) * 0.0, axis=1) + scale
    return xr, inv


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def chain_factors_kernel(
    q, k, g, beta, A_log, dt_bias, state_idx, parents, cu, log_p, fu, fo,
    scale, n_slots, n_rows, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_gn, s_gh, s_bn, s_bh, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr, TP: tl.constexpr,
    DS: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr,
):
    """One program per (request, value head, chunk): Fu_c, Fo_c and the chunk's logP."""
    b = tl.program_id(0)
    hv = tl.program_id(1)
    c = tl.program_id(2)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)
    c0 = c * BC
    n_ok = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    if (c0 < n_ok) & is_long_chain(parents, start, n_ok, TP, DS):
        neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)
        lane = tl.arange(0, BC)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        rows = c0 + lane
        rmask = rows < n_nodes
        rows_g = start + rows
        # logP before the chunk: the earlier rows' log decays
        before = tl.arange(0, TP)
        gp, _ = row_gates(g, beta, start + before, before < c0, hv, s_gn, s_gh, s_bn, s_bh, neg_a, bias, GATED,
                             False)
        gc, bc = row_gates(g, beta, rows_g, rmask, hv, s_gn, s_gh, s_bn, s_bh, neg_a, bias, GATED, True)
        lc = tl.cumsum(gc, 0)  # from the chunk's start, inclusive
        tl.store(log_p + rows_g * s_ln + hv, tl.sum(gp, axis=0) + lc, mask=rmask)

        kr, inv_k = _unit_rows(k, rows_g, rmask, h, s_kn, s_kh, offs_k, kmask, 1.0, USE_L2NORM)
        qr, inv_q = _unit_rows(q, rows_g, rmask, h, s_qn, s_qh, offs_k, kmask, scale, USE_L2NORM)
        kc = kr.to(tl.float32) * inv_k[:, None]
        qc = qr.to(tl.float32) * inv_q[:, None]
        lower = lane[:, None] >= lane[None, :]
        decay = tl.where(lower, tl.exp(tl.minimum(lc[:, None] - lc[None, :], 0.0)), 0.0)
        gram = tl.where(lane[:, None] > lane[None, :],
                        bc[:, None] * decay * tl.dot(kc, tl.trans(kc), input_precision=PRECISION), 0.0)
        f_u = inverse_by_blocks(gram, lane, tl.minimum(n_nodes - c0, BC), PRECISION) * bc[None, :]
        f_o = tl.dot(decay * tl.dot(qc, tl.trans(kc), input_precision=PRECISION), f_u, input_precision=PRECISION)
        at = ((b.to(tl.int64) * n_hv + hv) * (TP // BC) + c) * BC * BC + lane[:, None] * BC + lane[None, :]
        tl.store(fu + at, f_u)
        tl.store(fo + at, f_o)


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def chain_scan_kernel(
    q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, fu, fo,
    scale, n_slots, n_rows, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh, s_bn, s_bh,
    s_sn, s_sh, s_sv, s_on, s_oh, s_un, s_uh,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
    BC: tl.constexpr, BV: tl.constexpr, TP: tl.constexpr, DS: tl.constexpr,
    USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr,
):
    """One program per (request, value head, value tile): the chunks in order, the state
    tile [BV, K] carried in registers, each chunk's factors loaded (module comment)."""
    b = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)
    n_ok = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    if is_long_chain(parents, start, n_ok, TP, DS):
        neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)
        lane = tl.arange(0, BC)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        sb = tl.load(state + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :],
                     mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)  # [BV, KP]
        f_at = (b.to(tl.int64) * n_hv + hv) * (TP // BC) * BC * BC + lane[:, None] * BC + lane[None, :]
        for c0 in range(0, n_nodes, BC):
            rows = c0 + lane
            rmask = rows < n_nodes
            rows_g = start + rows
            # q's rows only feed the output's state product: taken first, then dead; k's rows
            # stay as loaded between their two products
            qr, inv_q = _unit_rows(q, rows_g, rmask, h, s_qn, s_qh, offs_k, kmask, scale, USE_L2NORM)
            gc, _ = row_gates(g, beta, rows_g, rmask, hv, s_gn, s_gh, s_bn, s_bh, neg_a, bias, GATED, False)
            lc = tl.cumsum(gc, 0)
            pc = tl.exp(lc)
            out = (pc * inv_q)[:, None] * tl.dot(qr.to(tl.float32), tl.trans(sb), input_precision=PRECISION)
            kr, inv_k = _unit_rows(k, rows_g, rmask, h, s_kn, s_kh, offs_k, kmask, 1.0, USE_L2NORM)
            # the unit rows' norms scale the products' rows (cheaper than the operands)
            z = tl.load(v + rows_g[:, None] * s_vn + hv * s_vh + offs_v[None, :],
                        mask=rmask[:, None] & vmask[None, :], other=0.0).to(tl.float32) \
                - (pc * inv_k)[:, None] * tl.dot(kr.to(tl.float32), tl.trans(sb), input_precision=PRECISION)
            uu = tl.dot(tl.load(fu + f_at + (c0 // BC) * BC * BC), z, input_precision=PRECISION)
            out += tl.dot(tl.load(fo + f_at + (c0 // BC) * BC * BC), z, input_precision=PRECISION)
            tile = rmask[:, None] & vmask[None, :]
            tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], uu, mask=tile)
            tl.store(o + rows_g[:, None] * s_on + hv * s_oh + offs_v[None, :], out.to(o.dtype.element_ty), mask=tile)
            last = tl.sum(gc, axis=0)
            w = tl.where(rmask, tl.exp(tl.minimum(last - lc, 0.0)), 0.0) * inv_k
            sb = tl.exp(last) * sb + tl.dot(tl.trans(uu * w[:, None]), kr.to(tl.float32), input_precision=PRECISION)


def chain_scratch_shape(bsz: int, hv: int, tp: int, bc: int) -> tuple:
    """v13's factor scratch: (Fu, Fo) x [B, HV, TP / BC, BC, BC] float32."""
    return (2, bsz, hv, tp // bc, bc, bc)


def launch_chain(args: VerifyArgs, bsz: int, cfg: dict, consts: dict) -> None:
    """The chain verify of `bsz` requests: the chunk factors for every (request, value head,
    chunk), then the scan; `cfg` is chain_launch_config's (BV, BC and warps already fitted to
    the shape), `consts` the shape constexprs (GROUP, K, V, KP, TP, DS, USE_L2NORM,
    PRECISION, GATED). The factors' scratch is allocated here."""
    q, hv = args.q, args.n_hv
    bc, tp = cfg["BC"], consts["TP"]
    fu, fo = torch.empty(chain_scratch_shape(bsz, hv, tp, bc), device=q.device, dtype=torch.float32)
    common = {key: consts[key] for key in ("GROUP", "K", "KP", "TP", "DS", "USE_L2NORM", "PRECISION", "GATED")}
    # the chunk factors at tf32x3 where the scan is at tf32: a chunk's solve and its output
    # factor, truncated to tf32, bias every chunk the same way, and a 256-node chain with strong
    # decay compounds them to 1.5x the bf16 floor (P-1); they are small products off the scan's
    # serial path (docs/design.md §9)
    factors = dict(common, PRECISION="tf32x3" if common["PRECISION"] == "tf32" else common["PRECISION"])
    chain_factors_kernel[(bsz, hv, tp // bc)](
        q, args.k, args.g, args.beta, args.A_log, args.dt_bias, args.state_idx, args.parents, args.cu, args.log_p,
        fu, fo, args.scale, args.n_slots, args.n_rows, hv, args.s_qn, args.s_qh, args.s_kn, args.s_kh, args.s_gn,
        args.s_gh, args.s_bn, args.s_bh, args.s_ln, BC=bc, num_warps=cfg["factor_warps"], **factors)
    chain_scan_kernel[(bsz, hv, triton.cdiv(consts["V"], cfg["BV"]))](
        q, args.k, args.v, args.g, args.beta, args.A_log, args.dt_bias, args.state, args.state_idx, args.parents,
        args.cu, args.o, args.u, fu, fo, args.scale, args.n_slots, args.n_rows, hv,
        args.s_qn, args.s_qh, args.s_kn, args.s_kh, args.s_vn, args.s_vh, args.s_gn, args.s_gh, args.s_bn, args.s_bh,
        args.s_sn, args.s_sh, args.s_sv, args.s_on, args.s_oh, args.s_un, args.s_uh,
        V=consts["V"], BC=bc, BV=cfg["BV"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **common)
