"""Closed-form tree verify for trees of at most 64 nodes: the whole tree in one tile.

One program per (request, value head, value part). The tree-only work is done once per
program and shared by every value tile it covers (docs/design.md §3, the one-tile kernel):

    walk      ancestor-or-self mask M and logP by pointer jumping (log2(depth) steps) over
              the parents held in registers (tl.gather; no dependent global loads)
    Gram      kk = K K^T, qk = Q K^T over key-dim slices (GRAM16: bf16/fp16 operands as
              they are, exact in the float32 accumulator and twice tf32's rate); the L2
              norms come from the same slices and scale the Gram terms afterwards
    solve     A = (I + G)^-1 explicitly, G = strict(M) * beta_i * exp(logP_i - logP_j) * kk,
              by the product form (I - G)(I + G^2)(I + G^4)... (exact: G^(depth+1) = 0)
              up to depth 8, by merging diagonal blocks of doubling size beyond
    C         Ce = C A, C = M * exp(logP_i - logP_j) * qk

then per value tile (BV columns of the state), with X = K S^T and Y = Q S^T:

    R = D_beta (V - D_P X),   U = A R,   O = D_P Y + Ce R.

At the "split" precision (docs/design.md §9) what feeds the state is exact to float32 while
the readout stays at tf32: X as two tf32 products of the raw 16-bit keys (exact in tf32)
with the state's tf32 high part and its rest (SPLIT_STATE; one product for a 16-bit pool,
exact in tf32 itself), A and U at STATE_PRECISION (tf32x3), so Eq. 10's commit from U is
exact; Y, Ce and O at PRECISION (tf32).

The state is read once per program; nothing per node is materialised beyond u and log_p.
Trees larger than the tile go to the blocked kernel (tree_verify_blocked.py); a request larger than
the promised tile (max_nodes broken under check_trees=False), or whose slot lies outside the
pool [0, n_slots), gets NaN outputs throughout and its slot is never read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from bole_cli.kernels.jit_math import (PRODUCT_FORM_DEPTH, gate_params, inverse_by_blocks, poison_rows, request_span,
                                      row_gates, unit_scales)
from bole_cli.kernels.types import VerifyArgs


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def tree_verify_tile_kernel(
    q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, log_p,
    scale, n_slots, n_rows, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh, s_bn, s_bh,
    s_sn, s_sh, s_sv, s_on, s_oh, s_un, s_uh, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
    TP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, VT: tl.constexpr,
    USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr, GRAM16: tl.constexpr,
    STATE_PRECISION: tl.constexpr, SPLIT_STATE: tl.constexpr, STORE_FACTORS: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    part = tl.program_id(2)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)

    if (n_nodes <= TP) & in_pool:
        rows = tl.arange(0, TP)
        rmask = rows < n_nodes
        rows_g = start + rows
        par = tl.load(parents + rows_g, mask=rmask, other=-1).to(tl.int32)
        neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)
        gv, bv = row_gates(g, beta, rows_g, rmask, hv, s_gn, s_gh, s_bn, s_bh, neg_a, bias, GATED, True)

        # Ancestor-or-self mask M and logP by pointer jumping: after s steps every row holds
        # its ancestors within 2^s - 1 levels (and their decays' sum) and points at the next
        # one, so a row takes the rows of the node it points at and jumps twice as far. A
        # tree of depth d takes ceil(log2(d + 1)) steps; all through registers (tl.gather).
        # (H200, batch 16 x 64 nodes: chains 169 -> 86 us, depth-8 trees 75 -> 70 us against
        # a level a step; squaring M with tensor-core products was slower, experiments/NOTES.md.)
        # A parent that does not precede its child (a malformed tree) ends its row.
        eye = rows[:, None] == rows[None, :]
        anc = (eye & rmask[:, None]).to(tl.int8)
        lp = gv
        cur = tl.where(rmask & (par < rows), par, -1)
        while tl.max(cur, axis=0) >= 0:
            act = cur >= 0
            safe = tl.where(act, cur, 0)
            anc = anc | (act[:, None] & (tl.gather(anc, tl.broadcast_to(safe[:, None], (TP, TP)), 0) != 0)).to(tl.int8)
            lp += tl.where(act, tl.gather(lp, safe, 0), 0.0)
            cur = tl.where(act, tl.gather(cur, safe, 0), -1)
        anc = anc != 0
        depth = tl.max(tl.sum(anc.to(tl.int32), axis=1), axis=0) - 1

        # Gram terms over key-dim slices; norms from the same slices.
        kk = tl.zeros([TP, TP], dtype=tl.float32)
        qk = tl.zeros([TP, TP], dtype=tl.float32)
        nk = tl.zeros([TP], dtype=tl.float32)
        nq = tl.zeros([TP], dtype=tl.float32)
        for kb in range(0, KP, BK):
            offs = kb + tl.arange(0, BK)
            m2 = rmask[:, None] & (offs < K)[None, :]
            kn = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=m2, other=0.0)
            qn = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0)
            kc = kn.to(tl.float32)
            qc = qn.to(tl.float32)
            if USE_L2NORM:
                nk += tl.sum(kc * kc, axis=1)
                nq += tl.sum(qc * qc, axis=1)
            if GRAM16:  # 16-bit inputs: their products are exact in the float32 accumulator
                kk += tl.dot(kn, tl.trans(kn))
                qk += tl.dot(qn, tl.trans(kn))
            else:
                kk += tl.dot(kc, tl.trans(kc), input_precision=PRECISION)
                qk += tl.dot(qc, tl.trans(kc), input_precision=PRECISION)
        inv_k, inv_q = unit_scales(nk, nq, scale, USE_L2NORM)

        ratio = tl.where(anc, tl.exp(tl.minimum(lp[:, None] - lp[None, :], 0.0)), 0.0)
        gram = tl.where(anc & ~eye, (bv * inv_k)[:, None] * ratio * kk * inv_k[None, :], 0.0)
        cmat = inv_q[:, None] * ratio * qk * inv_k[None, :]

        # (I + G)^-1 = (I - G)(I + G^2)(I + G^4)...: G is nilpotent of index depth + 1. Deeper
        # than PRODUCT_FORM_DEPTH, blocks are merged instead (float32-stable at any depth).
        if depth <= PRODUCT_FORM_DEPTH:
            ainv = tl.where(eye, 1.0, 0.0) - gram
            gpow = gram
            covered = depth * 0 + 1
            while covered < depth:
                gpow = tl.dot(gpow, gpow, input_precision=STATE_PRECISION)
                ainv += tl.dot(gpow, ainv, input_precision=STATE_PRECISION)
                covered = 2 * covered + 1
        else:
            ainv = inverse_by_blocks(gram, rows, n_nodes, STATE_PRECISION)
        ce = tl.dot(cmat, ainv, input_precision=PRECISION)

        p = tl.exp(lp)
        for vt in range(0, VT, BV):
            offs_v = part * VT + vt + tl.arange(0, BV)
            vmask = offs_v < V
            xs = tl.zeros([TP, BV], dtype=tl.float32)  # rows k_i^T S
            ys = tl.zeros([TP, BV], dtype=tl.float32)  # rows q_i^T S
            for kb in range(0, KP, BK):
                offs = kb + tl.arange(0, BK)
                m2 = rmask[:, None] & (offs < K)[None, :]
                kc = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=m2, other=0.0).to(tl.float32)
                qc = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0).to(tl.float32)
                sb = tl.load(state + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs[None, :],
                             mask=vmask[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)
                if SPLIT_STATE:  # k . S exact: 16-bit keys (exact in tf32) times the state
                    if state.dtype.element_ty == tl.float32:  # its tf32 high part, then its rest
                        s_hi = (sb.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
                        xs = tl.dot(kc, tl.trans(sb - s_hi), xs, input_precision="tf32")
                        xs = tl.dot(kc, tl.trans(s_hi), xs, input_precision="tf32")
                    else:  # a 16-bit pool is exact in tf32 itself: one product
                        xs = tl.dot(kc, tl.trans(sb), xs, input_precision="tf32")
                else:
                    xs += tl.dot(kc * inv_k[:, None], tl.trans(sb), input_precision=PRECISION)
                ys += tl.dot(qc * inv_q[:, None], tl.trans(sb), input_precision=PRECISION)
            if SPLIT_STATE:  # the keys' L2 norm after the exact products, not rounded into them
                xs = xs * inv_k[:, None]
            vc = tl.load(v + rows_g[:, None] * s_vn + hv * s_vh + offs_v[None, :],
                         mask=rmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
            r = bv[:, None] * (vc - p[:, None] * xs)
            out = p[:, None] * ys + tl.dot(ce, r, input_precision=PRECISION)
            tile = rmask[:, None] & vmask[None, :]
            if STORE_FACTORS:  # u for Eq. 10's commit (the replay commit reads neither u nor log_p)
                uu = tl.dot(ainv, r, input_precision=STATE_PRECISION)
                tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], uu, mask=tile)
            tl.store(o + rows_g[:, None] * s_on + hv * s_oh + offs_v[None, :], out.to(o.dtype.element_ty), mask=tile)
        if STORE_FACTORS:
            if part == 0:
                tl.store(log_p + rows_g * s_ln + hv, lp, mask=rmask)
    else:
        # A broken max_nodes promise (check_trees=False) or a slot outside the pool: every
        # row of the request becomes NaN (a value part at a time), and the pool is not read.
        poison_rows(o, u, log_p, start, n_nodes, part * VT, hv, s_on, s_oh, s_un, s_uh, s_ln, part == 0,
                    V, TP, BV, VT)


def value_split(vdim: int, bv: int, vsplit: int) -> tuple[int, int]:
    """(value columns per program, programs per value head) for V split in `vsplit` parts
    of whole BV tiles; a split finer than the tiles allow collapses to one tile a part."""
    tiles = triton.cdiv(vdim, bv)
    parts = max(1, min(int(vsplit), tiles))
    per_part = triton.cdiv(tiles, parts)
    return per_part * bv, triton.cdiv(tiles, per_part)


def launch_tile(args: VerifyArgs, bsz: int, max_nodes: int, vsplit: int, consts: dict) -> None:
    """The one-tile kernel over `bsz` requests, V split in `vsplit` parts (value_split); the
    tile is the largest tree rounded up to a power of two (at least 16: tl.dot's minimum)."""
    per_part, parts = value_split(args.v.shape[2], consts["BV"], vsplit)
    tp = max(16, triton.next_power_of_2(max_nodes))
    tree_verify_tile_kernel[(bsz, args.n_hv, parts)](*args, TP=tp, VT=per_part, **consts)
