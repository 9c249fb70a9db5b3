"""Closed-form tree verify for trees past one tile (up to 256 nodes): the blocked kernel.

v10 (experiments/README.md rows I17-a to I17-k): one program per (request, value head,
value tile). First the whole tree at once: each node's ancestor-or-self set as NW 64-bit words and logP, by
pointer jumping over the TP rows held in registers (ceil(log2(depth + 1)) steps of
tl.gather, as in the one-tile kernel; the level-a-step walk it replaced made 256-node chains
slow). Then chunks of BC consecutive nodes in order (parents come first, so a chunk only
depends on earlier chunks): for chunk c,

    R_c = D_beta (V_c - D_P K_c S^T)  -  sum_{c' < c} G[c, c'] U_c'
    U_c = (I + G_cc)^-1 R_c            (product form (I-G)(I+G^2)(I+G^4)... up to depth 8,
                                        merged diagonal blocks beyond: jit_math)
    O_c = D_P Q_c S^T  +  sum_{c' <= c} C[c, c'] U_c'

G and C are the ancestor-masked Gram terms built from k, q and exp(logP_i - logP_j); they
are rebuilt per value tile from k and q and never materialise a per-node state; a chunk
pair with no ancestor link (wide trees, several roots) is skipped. U of finished chunks is
written to `u` and read back by later chunks of the same program (hence the barrier).
TP is the promised tree size rounded up to a power of two (else 256): a request larger
than it, or whose slot lies outside the pool, gets NaN rows and its slot is never read.
Measured history and what limits it: experiments/NOTES.md "Big trees".
"""

from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from bole_cli.kernels.jit_math import (PRODUCT_FORM_DEPTH, gate_params, inverse_by_blocks, is_long_chain,
                                      poison_rows, request_span, unit_scales)
from bole_cli.kernels.tree_verify_parts import ancestor_words, launch_parts, state_products
from bole_cli.kernels.types import VerifyArgs
from bole_cli.kernels.validate import MAX_TREE_NODES


@triton.jit
def _block_mask(bits, cols, c0, NW: tl.constexpr):
    """[BC, BC] mask: column j (local index cols[j], all in one 64-bit word) is in row i's A+."""
    word = c0 // 64
    sel = tl.arange(0, NW)[None, :] == word
    row_word = tl.sum(tl.where(sel, bits, 0), axis=1)  # [BC] int64
    shift = (cols % 64).to(tl.int64)
    return ((row_word[:, None] >> shift[None, :]) & 1) != 0


@triton.jit
def _gram(a, b, rows_g, rmask, h, s_an, s_ah, s_bn, s_bh, K: tl.constexpr, KP: tl.constexpr,
          BC: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, GRAM16: tl.constexpr):
    """A_c B_c^T of one chunk's rows (raw, unnormalised) over key-dim slices."""
    acc = tl.zeros([BC, BC], dtype=tl.float32)
    for kb in range(0, KP, BK):
        offs = kb + tl.arange(0, BK)
        m2 = rmask[:, None] & (offs < K)[None, :]
        an = tl.load(a + rows_g[:, None] * s_an + h * s_ah + offs[None, :], mask=m2, other=0.0)
        bn = tl.load(b + rows_g[:, None] * s_bn + h * s_bh + offs[None, :], mask=m2, other=0.0)
        if GRAM16:  # 16-bit inputs: their products are exact in the float32 accumulator
            acc += tl.dot(an, tl.trans(bn))
        else:
            acc += tl.dot(an.to(tl.float32), tl.trans(bn.to(tl.float32)), input_precision=PRECISION)
    return acc


@triton.jit
def _gram_block(at, rows, cols, n, TP: tl.constexpr):
    """[BC, BC] block (rows, cols) of a request-head's [TP, TP] Gram workspace (zero
    outside the tree's n nodes: never read there). The parts write every tile on or below
    the diagonal, at least BC wide (launch_parts), so every entry read here is written."""
    return tl.load(at + rows[:, None] * TP + cols[None, :], mask=(rows < n)[:, None] & (cols < n)[None, :],
                   other=0.0)


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def tree_verify_blocked_kernel(
    q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, log_p,
    scale, n_slots, n_rows, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh, s_bn, s_bh,
    s_sn, s_sh, s_sv, s_on, s_oh, s_un, s_uh, s_ln,
    ys, kk_ws, qk_ws, bits_ws, s_yn, s_yh,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
    BC: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, NW: tl.constexpr, TP: tl.constexpr,
    DS: tl.constexpr, REMAINDER: tl.constexpr, SPLIT: tl.constexpr,
    USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr, GRAM16: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)
    if SPLIT:  # the Gram terms of (request, key head): tree_verify_parts.py's Gram role
        kk_at = kk_ws + (b.to(tl.int64) * (n_hv // GROUP) + h) * TP * TP
        qk_at = qk_ws + (b.to(tl.int64) * (n_hv // GROUP) + h) * TP * TP
    # a slot outside the pool, or a tree larger than the promised TP: no chunk runs, NaN rows
    n_solved = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    n_poison = n_nodes - n_solved
    if REMAINDER:  # after the chain kernel, which took the chains at least DS deep
        n_solved = tl.where(is_long_chain(parents, start, n_solved, TP, DS), 0, n_solved)

    offs_v = iv * BV + tl.arange(0, BV)
    vmask = offs_v < V
    lane = tl.arange(0, BC)
    words = tl.arange(0, NW)
    neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)

    # The whole tree at once (TP rows in registers): ancestor-or-self bitmask (NW 64-bit
    # words a row) and logP by pointer jumping, ceil(log2(depth + 1)) steps of tl.gather, as
    # the one-tile kernel does; chunks below take their rows with one more gather each.
    if not SPLIT:  # (SPLIT: the parts' walk wrote them; the chunks load their rows)
        bits, lp = ancestor_words(parents, g, start, n_solved, hv, s_gn, s_gh, neg_a, bias, TP, NW, GATED)

    for c in range(0, tl.cdiv(n_solved, BC)):
        c0 = c * BC
        rows = c0 + lane
        rmask = rows < n_nodes
        rows_g = start + rows
        if SPLIT:
            rbits = tl.load(bits_ws + rows_g[:, None] * NW + words[None, :], mask=rmask[:, None], other=0)
            lpc = tl.load(log_p + rows_g * s_ln + hv, mask=rmask, other=0.0)
        else:
            rbits = tl.gather(bits, tl.broadcast_to(rows[:, None], (BC, NW)), 0)
            lpc = tl.gather(lp, rows, 0)
        bc = tl.load(beta + rows_g * s_bn + hv * s_bh, mask=rmask, other=0.0).to(tl.float32)
        if GATED:
            bc = tl.where(rmask, tl.sigmoid(bc), 0.0)
        p = tl.exp(lpc)

        # The chunk's products with the state over key-dim slices (whole [BC, K] float32
        # operands do not fit the registers); the L2 norms come from the same slices and
        # scale the products afterwards.
        if SPLIT:  # unit and scaled already (tree_verify_parts.py's state products)
            tile = rmask[:, None] & vmask[None, :]
            xs = tl.load(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], mask=tile, other=0.0)
            ys_c = tl.load(ys + rows_g[:, None] * s_yn + hv * s_yh + offs_v[None, :], mask=tile, other=0.0)
            inv_k = tl.full([BC], 1.0, tl.float32)
            inv_q = tl.full([BC], 1.0, tl.float32)
        else:
            xs, ys_c, nk, nq = state_products(q, k, state, rows_g, rmask, h, hv, slot, offs_v, vmask, s_qn, s_qh, s_kn,
                                              s_kh, s_sn, s_sh, s_sv, K, KP, BK, BC, BV, USE_L2NORM, PRECISION)
            inv_k, inv_q = unit_scales(nk, nq, scale, USE_L2NORM)
        vc = tl.load(v + rows_g[:, None] * s_vn + hv * s_vh + offs_v[None, :],
                     mask=rmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        r = bc[:, None] * (vc - (p * inv_k)[:, None] * xs)
        out = (p * inv_q)[:, None] * ys_c

        # Earlier chunks: R -= G[c, c'] U_c', O += C[c, c'] U_c' (U_c' written by this program
        # before the barrier). A pair with no ancestor link (wide trees, several roots) is skipped.
        for c2 in range(0, c):
            cols = c2 * BC + lane
            m = _block_mask(rbits, cols, c2 * BC, NW)
            if tl.max(tl.max(m.to(tl.int32), axis=1), axis=0) > 0:
                cols_g = start + cols
                if SPLIT:
                    kkj = _gram_block(kk_at, rows, cols, n_solved, TP)
                    qkj = _gram_block(qk_at, rows, cols, n_solved, TP)
                    inv_kj = tl.full([BC], 1.0, tl.float32)
                else:
                    kkj = tl.zeros([BC, BC], dtype=tl.float32)
                    qkj = tl.zeros([BC, BC], dtype=tl.float32)
                    nkj = tl.zeros([BC], dtype=tl.float32)
                    for kb in range(0, KP, BK):
                        offs = kb + tl.arange(0, BK)
                        m2 = rmask[:, None] & (offs < K)[None, :]
                        kn = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=m2, other=0.0)
                        qn = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0)
                        kj = tl.load(k + cols_g[:, None] * s_kn + h * s_kh + offs[None, :],
                                     mask=(offs < K)[None, :], other=0.0)
                        if USE_L2NORM:
                            kjf = kj.to(tl.float32)
                            nkj += tl.sum(kjf * kjf, axis=1)
                        if GRAM16:
                            kkj += tl.dot(kn, tl.trans(kj))
                            qkj += tl.dot(qn, tl.trans(kj))
                        else:
                            kkj += tl.dot(kn.to(tl.float32), tl.trans(kj.to(tl.float32)), input_precision=PRECISION)
                            qkj += tl.dot(qn.to(tl.float32), tl.trans(kj.to(tl.float32)), input_precision=PRECISION)
                    if USE_L2NORM:
                        inv_kj = 1.0 / tl.sqrt(nkj + 1e-6)
                    else:
                        inv_kj = tl.full([BC], 1.0, tl.float32)
                if SPLIT:
                    lpj = tl.load(log_p + cols_g * s_ln + hv)
                else:
                    lpj = tl.gather(lp, cols, 0)
                uj = tl.load(u + cols_g[:, None] * s_un + hv * s_uh + offs_v[None, :],
                             mask=vmask[None, :], other=0.0)
                ratio = tl.where(m, tl.exp(tl.minimum(lpc[:, None] - lpj[None, :], 0.0)), 0.0) * inv_kj[None, :]
                gram = (bc * inv_k)[:, None] * ratio * kkj
                cmat = inv_q[:, None] * ratio * qkj
                r -= tl.dot(gram, uj, input_precision=PRECISION)
                out += tl.dot(cmat, uj, input_precision=PRECISION)

        # The diagonal block: K_c K_c^T first, the solve, then Q_c K_c^T (two passes over the
        # slices, so that only one [BC, BC] Gram tile is live next to the solve's).
        m = _block_mask(rbits, rows, c0, NW)
        ratio = tl.where(m, tl.exp(tl.minimum(lpc[:, None] - lpc[None, :], 0.0)), 0.0) * inv_k[None, :]
        if SPLIT:
            kk = _gram_block(kk_at, rows, rows, n_solved, TP)
        else:
            kk = _gram(k, k, rows_g, rmask, h, s_kn, s_kh, s_kn, s_kh, K, KP, BC, BK, PRECISION, GRAM16)
        gram = tl.where(m & (rows[None, :] != rows[:, None]), (bc * inv_k)[:, None] * ratio * kk, 0.0)

        # (I + G_cc)^-1 R: the product form (I - G)(I + G^2)(I + G^4)... (G nilpotent of
        # index depth + 1) up to PRODUCT_FORM_DEPTH, merged diagonal blocks beyond
        # (float32-stable at any depth; docs/design.md §2).
        depth = tl.max(tl.sum(m.to(tl.int32), axis=1), axis=0) - 1
        if depth <= PRODUCT_FORM_DEPTH:
            x = r - tl.dot(gram, r, input_precision=PRECISION)
            gpow = gram
            covered = depth * 0 + 1
            while covered < depth:
                gpow = tl.dot(gpow, gpow, input_precision=PRECISION)
                x += tl.dot(gpow, x, input_precision=PRECISION)
                covered = 2 * covered + 1
        else:
            x = tl.dot(inverse_by_blocks(gram, lane, tl.minimum(n_nodes - c0, BC), PRECISION), r,
                       input_precision=PRECISION)
        if SPLIT:
            qk = _gram_block(qk_at, rows, rows, n_solved, TP)
        else:
            qk = _gram(q, k, rows_g, rmask, h, s_qn, s_qh, s_kn, s_kh, K, KP, BC, BK, PRECISION, GRAM16)
        out += tl.dot(inv_q[:, None] * ratio * qk, x, input_precision=PRECISION)

        tile = rmask[:, None] & vmask[None, :]
        tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], x, mask=tile)
        tl.store(o + rows_g[:, None] * s_on + hv * s_oh + offs_v[None, :], out.to(o.dtype.element_ty), mask=tile)
        if (iv == 0) & (not SPLIT):
            tl.store(log_p + rows_g * s_ln + hv, lpc, mask=rmask)
        tl.debug_barrier()  # later chunks of this program read u back
    # ... and its outputs are NaN instead (no rows when the request was solved)
    poison_rows(o, u, log_p, start, n_poison, iv * BV, hv, s_on, s_oh, s_un, s_uh, s_ln, iv == 0,
                V, BC, BV, BV)


def blocked_tp(max_nodes: Optional[int]) -> int:
    """Rows of the blocked kernel's whole-tree walk: the promised size rounded up to a power
    of two (a larger request gets NaN rows), else the limit."""
    return max(64, triton.next_power_of_2(max_nodes or MAX_TREE_NODES))


def launch_blocked(args: VerifyArgs, bsz: int, consts: dict) -> None:
    """The blocked kernel over `bsz` requests, after its SPLIT parts (tree_verify_parts.py)
    when consts["SPLIT"] (their workspaces allocated only then). `consts`: the constexprs
    and launch settings (GROUP, K, V, KP, BV, BK, BC, NW, TP, DS, REMAINDER, SPLIT,
    USE_L2NORM, PRECISION, GATED, GRAM16, num_warps, num_stages)."""
    grid = (bsz, args.n_hv, triton.cdiv(consts["V"], consts["BV"]))
    if consts["SPLIT"]:
        ys, gram, bits = launch_parts(args, bsz, consts)
        tree_verify_blocked_kernel[grid](*args, ys, gram[0], gram[1], bits, ys.stride(0), ys.stride(1), **consts)
    else:
        u = args.u  # the workspaces are never read
        tree_verify_blocked_kernel[grid](*args, u, u, u, u, 0, 0, **consts)
