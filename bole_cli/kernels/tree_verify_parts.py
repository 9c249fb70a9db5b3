"""The blocked verify's tree-independent parts, one wide launch before it (SPLIT; experiments/README.md I17-k).

The blocked kernel (tree_verify_blocked.py) runs one long dependent chain per (request, value head,
value tile) at 2-4 programs an SM; its ancestor walk, its products with the state and its
Gram terms need no chunk order at all, so with SPLIT they run first in one launch whose
programs take one of three roles (the heavy ones first, the light ones filling the tail),
and the tree stage loads what they wrote (docs/design.md §3, SPLIT; measured:
experiments/NOTES.md "Big trees, fifth session"):

    state products  per (request, value head, value tile): x_i = k^_i^T S and
                    y_i = scale q^_i^T S (unit keys and queries when L2-normalised) for
                    every node, rows of BR at a time; x goes to `u` (which the tree stage
                    overwrites with U row chunk by row chunk, after reading it), y to a
                    float32 workspace [N, HV, V]
    Gram            per (request, key head, [BG, BG] tile on or below the diagonal):
                    k^_i . k^_j and scale q^_i . k^_j into two float32 workspaces
                    [B, H, TP, TP], shared by the key head's value heads and tiles
    walk            per (request, value head): logP into log_p and (head 0) the ancestor
                    words into [N, NW] (pointer jumping), read back a chunk at a time

A request the tree stage does not compute (slot outside the pool, more than TP nodes, or a
long chain the chain kernel took) is skipped by every role, so none reads the pool outside
its bounds nor writes rows another kernel owns. ROLES (a bit each, in the order above)
leaves roles out, for timing them apart (experiments/ab_big_trees.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.kernels.configs import PARTS_LAUNCH
from bole_cli.kernels.jit_math import gate_params, is_long_chain, request_span, row_gates, valid_parents
from bole_cli.kernels.types import VerifyArgs


@triton.jit
def solved_nodes(cu, state_idx, parents, b, n_slots, n_rows, TP: tl.constexpr, DS: tl.constexpr,
                 REMAINDER: tl.constexpr):
    """(first node, nodes the tree stage solves: 0 when it skips the request, slot): as
    the blocked kernel decides it, so the parts cover exactly its requests."""
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)
    n_solved = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    if REMAINDER:
        n_solved = tl.where(is_long_chain(parents, start, n_solved, TP, DS), 0, n_solved)
    return start, n_solved, slot


@triton.jit
def ancestor_words(parents, g, start, n_solved, hv, s_gn, s_gh, neg_a, bias, TP: tl.constexpr, NW: tl.constexpr,
                   GATED: tl.constexpr):
    """The whole tree at once (TP rows in registers): each node's ancestor-or-self set as NW
    64-bit words and its logP, by pointer jumping, ceil(log2(depth + 1)) steps of
    tl.gather (as the one-tile kernel does). Returns (bits [TP, NW], logP [TP])."""
    alln = tl.arange(0, TP)
    words = tl.arange(0, NW)
    amask = alln < n_solved
    lp, _ = row_gates(g, g, start + alln, amask, hv, s_gn, s_gh, 0, 0, neg_a, bias, GATED, False)
    one = tl.full([TP, NW], 1, tl.int64)
    own = amask[:, None] & (words[None, :] == (alln // 64)[:, None])
    bits = tl.where(own, one << (alln % 64).to(tl.int64)[:, None], 0)
    cur = valid_parents(parents, start + alln, alln, amask)
    while tl.max(cur, axis=0) >= 0:
        act = cur >= 0
        safe = tl.where(act, cur, 0)
        bits = bits | tl.where(act[:, None], tl.gather(bits, tl.broadcast_to(safe[:, None], (TP, NW)), 0), 0)
        lp += tl.where(act, tl.gather(lp, safe, 0), 0.0)
        cur = tl.where(act, tl.gather(cur, safe, 0), -1)
    return bits, lp


@triton.jit
def state_products(q, k, state, rows_g, rmask, h, hv, slot, offs_v, vmask, s_qn, s_qh, s_kn, s_kh, s_sn, s_sh, s_sv,
                   K: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, R: tl.constexpr, BV: tl.constexpr,
                   USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr):
    """Rows k_i^T S and q_i^T S [R, BV] (value columns offs_v) over key-dim slices (whole
    [R, K] float32 operands do not fit the registers), with the rows' squared norms from the
    same slices (zero unless USE_L2NORM)."""
    x = tl.zeros([R, BV], dtype=tl.float32)
    y = tl.zeros([R, BV], dtype=tl.float32)
    nk = tl.zeros([R], dtype=tl.float32)
    nq = tl.zeros([R], dtype=tl.float32)
    for kb in range(0, KP, BK):
        offs = kb + tl.arange(0, BK)
        m2 = rmask[:, None] & (offs < K)[None, :]
        kc = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=m2, other=0.0).to(tl.float32)
        qc = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0).to(tl.float32)
        if USE_L2NORM:
            nk += tl.sum(kc * kc, axis=1)
            nq += tl.sum(qc * qc, axis=1)
        sb = tl.load(state + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs[None, :],
                     mask=vmask[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)
        x += tl.dot(kc, tl.trans(sb), input_precision=PRECISION)
        y += tl.dot(qc, tl.trans(sb), input_precision=PRECISION)
    return x, y, nk, nq


@triton.jit
def _walk_role(g, A_log, dt_bias, state_idx, parents, cu, log_p, bits_ws, n_slots, n_rows, s_gn, s_gh, s_ln, b, hv,
               TP: tl.constexpr, NW: tl.constexpr, DS: tl.constexpr, REMAINDER: tl.constexpr, GATED: tl.constexpr):
    start, n_solved, slot = solved_nodes(cu, state_idx, parents, b, n_slots, n_rows, TP, DS, REMAINDER)
    neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)
    if n_solved > 0:
        bits, lp = ancestor_words(parents, g, start, n_solved, hv, s_gn, s_gh, neg_a, bias, TP, NW, GATED)
        alln = tl.arange(0, TP)
        amask = alln < n_solved
        tl.store(log_p + (start + alln) * s_ln + hv, lp, mask=amask)
        if hv == 0:  # the tree is the same for every head
            words = tl.arange(0, NW)
            tl.store(bits_ws + (start + alln)[:, None] * NW + words[None, :], bits, mask=amask[:, None])


@triton.jit
def _state_products_role(q, k, state, state_idx, parents, cu, xs, ys, scale, n_slots, n_rows,
                         s_qn, s_qh, s_kn, s_kh, s_sn, s_sh, s_sv, s_xn, s_xh, s_yn, s_yh, b, hv, iv,
                         GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BR: tl.constexpr,
                         BV: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr, DS: tl.constexpr,
                         REMAINDER: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr):
    h = hv // GROUP
    start, n_solved, slot = solved_nodes(cu, state_idx, parents, b, n_slots, n_rows, TP, DS, REMAINDER)
    offs_v = iv * BV + tl.arange(0, BV)
    vmask = offs_v < V
    for r0 in range(0, n_solved, BR):
        rows = r0 + tl.arange(0, BR)
        rmask = rows < n_solved
        rows_g = start + rows
        x, y, nk, nq = state_products(q, k, state, rows_g, rmask, h, hv, slot, offs_v, vmask, s_qn, s_qh, s_kn, s_kh,
                                      s_sn, s_sh, s_sv, K, KP, BK, BR, BV, USE_L2NORM, PRECISION)
        if USE_L2NORM:
            x = x * (1.0 / tl.sqrt(nk + 1e-6))[:, None]
            y = y * (scale / tl.sqrt(nq + 1e-6))[:, None]
        else:
            y = y * scale
        tile = rmask[:, None] & vmask[None, :]
        tl.store(xs + rows_g[:, None] * s_xn + hv * s_xh + offs_v[None, :], x, mask=tile)
        tl.store(ys + rows_g[:, None] * s_yn + hv * s_yh + offs_v[None, :], y, mask=tile)


@triton.jit
def _row_norms(a, rows_g, rmask, h, s_an, s_ah, K: tl.constexpr, KP: tl.constexpr, BG: tl.constexpr,
               BK: tl.constexpr):
    acc = tl.zeros([BG], dtype=tl.float32)
    for kb in range(0, KP, BK):
        offs = kb + tl.arange(0, BK)
        x = tl.load(a + rows_g[:, None] * s_an + h * s_ah + offs[None, :],
                    mask=rmask[:, None] & (offs < K)[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(acc + 1e-6)


@triton.jit
def _gram_role(q, k, state_idx, parents, cu, gram_kk, gram_qk, scale, n_slots, n_rows, n_h, s_qn, s_qh, s_kn, s_kh,
               b, h, t,
               K: tl.constexpr, KP: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr,
               DS: tl.constexpr, REMAINDER: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr,
               GRAM16: tl.constexpr):
    ci = t // (TP // BG)
    cj = t % (TP // BG)
    start, n_solved, slot = solved_nodes(cu, state_idx, parents, b, n_slots, n_rows, TP, DS, REMAINDER)
    if (cj <= ci) & (ci * BG < n_solved):
        rows = ci * BG + tl.arange(0, BG)
        cols = cj * BG + tl.arange(0, BG)
        rmask = rows < n_solved
        cmask = cols < n_solved
        rows_g = start + rows
        cols_g = start + cols
        kk = tl.zeros([BG, BG], dtype=tl.float32)
        qk = tl.zeros([BG, BG], dtype=tl.float32)
        for kb in range(0, KP, BK):
            offs = kb + tl.arange(0, BK)
            kmask = (offs < K)[None, :]
            kn = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=rmask[:, None] & kmask, other=0.0)
            qn = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=rmask[:, None] & kmask, other=0.0)
            kj = tl.load(k + cols_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=cmask[:, None] & kmask, other=0.0)
            if GRAM16:  # 16-bit inputs: their products are exact in the float32 accumulator
                kk += tl.dot(kn, tl.trans(kj))
                qk += tl.dot(qn, tl.trans(kj))
            else:
                kk += tl.dot(kn.to(tl.float32), tl.trans(kj.to(tl.float32)), input_precision=PRECISION)
                qk += tl.dot(qn.to(tl.float32), tl.trans(kj.to(tl.float32)), input_precision=PRECISION)
        if USE_L2NORM:
            inv_kj = _row_norms(k, cols_g, cmask, h, s_kn, s_kh, K, KP, BG, BK)
            kk = kk * _row_norms(k, rows_g, rmask, h, s_kn, s_kh, K, KP, BG, BK)[:, None] * inv_kj[None, :]
            qk = qk * (scale * _row_norms(q, rows_g, rmask, h, s_qn, s_qh, K, KP, BG, BK))[:, None] * inv_kj[None, :]
        else:
            qk = qk * scale
        base = (b.to(tl.int64) * n_h + h) * TP * TP
        at = base + rows[:, None] * TP + cols[None, :]
        tile = rmask[:, None] & cmask[None, :]
        tl.store(gram_kk + at, kk, mask=tile)
        tl.store(gram_qk + at, qk, mask=tile)


@triton.jit(do_not_specialize=["n_slots", "n_rows", "n_req"])
def parts_kernel(
    q, k, g, A_log, dt_bias, state, state_idx, parents, cu, xs, ys, log_p, bits_ws, gram_kk, gram_qk,
    scale, n_slots, n_rows, n_req, n_h, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_gn, s_gh, s_sn, s_sh, s_sv, s_xn, s_xh, s_yn, s_yh, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BR: tl.constexpr,
    BV: tl.constexpr, BK: tl.constexpr, BG: tl.constexpr, TP: tl.constexpr, NW: tl.constexpr, DS: tl.constexpr,
    REMAINDER: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GRAM16: tl.constexpr,
    GATED: tl.constexpr, ROLES: tl.constexpr,
):
    """One program of a role, by program id: state products, then Gram tiles, then walks
    (parts_grid gives the count)."""
    pid = tl.program_id(0)
    n_vt = tl.cdiv(V, BV)
    n_p = n_req * n_hv * n_vt if ROLES & 1 else 0
    n_g = n_req * n_h * (TP // BG) * (TP // BG) if ROLES & 2 else 0
    if pid < n_p:
        b = pid // (n_hv * n_vt)
        rest = pid % (n_hv * n_vt)
        _state_products_role(q, k, state, state_idx, parents, cu, xs, ys, scale, n_slots, n_rows,
                             s_qn, s_qh, s_kn, s_kh, s_sn, s_sh, s_sv, s_xn, s_xh, s_yn, s_yh, b, rest // n_vt,
                             rest % n_vt, GROUP, K, V, KP, BR, BV, BK, TP, DS, REMAINDER, USE_L2NORM, PRECISION)
    elif pid < n_p + n_g:
        t = pid - n_p
        per = n_h * (TP // BG) * (TP // BG)
        _gram_role(q, k, state_idx, parents, cu, gram_kk, gram_qk, scale, n_slots, n_rows, n_h, s_qn, s_qh, s_kn, s_kh,
                   t // per, (t % per) // ((TP // BG) * (TP // BG)), t % ((TP // BG) * (TP // BG)),
                   K, KP, BG, BK, TP, DS, REMAINDER, USE_L2NORM, PRECISION, GRAM16)
    else:
        t = pid - n_p - n_g
        _walk_role(g, A_log, dt_bias, state_idx, parents, cu, log_p, bits_ws, n_slots, n_rows, s_gn, s_gh, s_ln,
                   t // n_hv, t % n_hv, TP, NW, DS, REMAINDER, GATED)


def parts_grid(n_req: int, n_h: int, n_hv: int, vdim: int, bv: int, bg: int, tp: int, roles: int) -> int:
    """Programs of parts_kernel: each role in ROLES, in parts_kernel's order."""
    return (n_req * n_hv * triton.cdiv(vdim, bv) * (roles & 1) + n_req * n_h * (tp // bg) ** 2 * (roles >> 1 & 1)
            + n_req * n_hv * (roles >> 2 & 1))


def split_workspaces(n: int, bsz: int, h: int, hv: int, vdim: int, tp: int) -> tuple:
    """SPLIT's scratch, ((shape, dtype) of y [N, HV, V], the Gram terms [2, B, H, TP, TP],
    the ancestor words [N, NW]): allocated per launch, reused by the next layer's."""
    return (((n, hv, vdim), torch.float32), ((2, bsz, h, tp, tp), torch.float32), ((n, tp // 64), torch.int64))


def launch_parts(args: VerifyArgs, bsz: int, consts: dict) -> tuple:
    """The parts of `bsz` requests in one launch (PARTS_LAUNCH's settings), writing x = K S^T
    into args.u, logP into args.log_p and the rest into workspaces allocated here; `consts`
    are the blocked kernel's (GROUP, K, V, KP, BC, TP, NW, DS, REMAINDER, USE_L2NORM,
    PRECISION, GRAM16, GATED). Returns the workspaces (y, the Gram terms, the ancestor words)."""
    q, u, log_p, state = args.q, args.u, args.log_p, args.state
    tp, h, hv = consts["TP"], q.shape[1], args.n_hv
    ys, gram, bits = (torch.empty(shape, device=q.device, dtype=dtype)
                      for shape, dtype in split_workspaces(q.shape[0], bsz, h, hv, consts["V"], tp))
    # the Gram tiles at least a chunk wide: the tree stage's diagonal blocks lie in written tiles
    bv, roles = PARTS_LAUNCH["BV"], PARTS_LAUNCH["ROLES"]
    bg = min(max(PARTS_LAUNCH["BG"], consts["BC"]), tp)
    parts_kernel[(parts_grid(bsz, h, hv, consts["V"], bv, bg, tp, roles),)](
        q, args.k, args.g, args.A_log, args.dt_bias, state, args.state_idx, args.parents, args.cu, u, ys, log_p,
        bits, gram[0], gram[1], args.scale, args.n_slots, args.n_rows, bsz, h, hv,
        args.s_qn, args.s_qh, args.s_kn, args.s_kh, args.s_gn, args.s_gh, args.s_sn, args.s_sh, args.s_sv,
        args.s_un, args.s_uh, ys.stride(0), ys.stride(1), args.s_ln,
        BR=PARTS_LAUNCH["BR"], BV=bv, BK=min(PARTS_LAUNCH["BK"], consts["KP"]), BG=bg, ROLES=roles,
        num_warps=PARTS_LAUNCH["num_warps"], num_stages=PARTS_LAUNCH["num_stages"],
        **{key: consts[key] for key in ("GROUP", "K", "V", "KP", "TP", "NW", "DS", "REMAINDER", "USE_L2NORM",
                                         "PRECISION", "GRAM16", "GATED")})
    return ys, gram, bits
