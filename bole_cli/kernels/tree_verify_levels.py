"""Closed-form verify of shallow big trees level by level (v14; experiments/README.md I17-m).

A tree of depth d (the most strict ancestors of a node) has at most d + 1 nonzero entries
a row in G and C (docs/design.md §2): a node's ancestors. The blocked kernel computes them
as dense [T, T] tiles, chunk pair by chunk pair in a dependent chain; here they are only
the d + 1 that exist, and the solve (I + G) U = R runs by depth:

    U = R;  for r = 0 .. d - 1:  every node deeper than r takes its ancestor j at depth r
            (whose U is final once the levels above it are done):
                U_i -= beta_i exp(logP_i - logP_j) (k^_i . k^_j) U_j
                O_i +=        exp(logP_i - logP_j) (q^_i . k^_j) U_j
    O_i += (q^_i . k^_i) U_i

so a program takes all of a request's rows at once and its dependent part is d steps of
one row gather each. Two launches:

    levels_gram_kernel   per (request, key head, distance m, row block): the ancestor at
                         distance m of every node (m gathers of `parents`), and the unit
                         products k^_i . k^_j and scale q^_i . k^_j with it (m = 0: the
                         node itself), into [N, H, DW] scratch; head 0 writes the
                         ancestors [N, DW] (local indices, -1: none)
    tree_levels_kernel   per (request, value head, value tile): logP and depths by pointer
                         jumping, the state products of all rows, then the levels above,
                         each level's final U rows written to `u` and read back (a barrier
                         a level)

Depths up to DW - 1 (a launch knob: the promised depth rounded up); a deeper request (a
broken promise), a slot outside the pool or a tree larger than TP gets NaN rows and its
slot is never read. Measured: experiments/NOTES.md "Big trees, sixth session".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.kernels.jit_math import gate_params, poison_rows, request_span, row_gates, unit_scales, valid_parents
from bole_cli.kernels.tree_verify_parts import state_products
from bole_cli.kernels.types import VerifyArgs


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def levels_gram_kernel(
    q, k, state_idx, parents, cu, ancestors, kk, qk,
    scale, n_slots, n_rows, n_h,
    s_qn, s_qh, s_kn, s_kh,
    K: tl.constexpr, KP: tl.constexpr, TP: tl.constexpr, RB: tl.constexpr, DW: tl.constexpr,
    USE_L2NORM: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m = tl.program_id(2) // (TP // RB)  # the distance
    r0 = (tl.program_id(2) % (TP // RB)) * RB
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)
    n_ok = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    if r0 < n_ok:
        alln = tl.arange(0, TP)
        par = valid_parents(parents, start + alln, alln, alln < n_ok)
        cur = tl.where(alln < n_ok, alln, -1)
        for _ in range(0, m):
            cur = tl.where(cur >= 0, tl.gather(par, tl.maximum(cur, 0), 0), -1)
        rows = r0 + tl.arange(0, RB)
        rmask = rows < n_ok
        anc = tl.where(rmask, tl.gather(cur, tl.minimum(rows, TP - 1), 0), -1)  # this block's rows
        at = (start + rows) * DW + m
        if h == 0:
            tl.store(ancestors + at, anc, mask=rmask)
        on = anc >= 0
        if tl.max(on.to(tl.int32), axis=0) > 0:
            offs = tl.arange(0, KP)
            kmask = (offs < K)[None, :]
            ki = tl.load(k + (start + rows)[:, None] * s_kn + h * s_kh + offs[None, :], mask=rmask[:, None] & kmask,
                         other=0.0).to(tl.float32)
            qi = tl.load(q + (start + rows)[:, None] * s_qn + h * s_qh + offs[None, :], mask=rmask[:, None] & kmask,
                         other=0.0).to(tl.float32)
            kj = tl.load(k + (start + tl.maximum(anc, 0))[:, None] * s_kn + h * s_kh + offs[None, :],
                         mask=on[:, None] & kmask, other=0.0).to(tl.float32)
            dkk = tl.sum(ki * kj, axis=1)
            dqk = tl.sum(qi * kj, axis=1) * scale
            if USE_L2NORM:  # as the other kernels: x / sqrt(sum x^2 + 1e-6)
                inv_kj = 1.0 / tl.sqrt(tl.sum(kj * kj, axis=1) + 1e-6)
                dkk = dkk * inv_kj / tl.sqrt(tl.sum(ki * ki, axis=1) + 1e-6)
                dqk = dqk * inv_kj / tl.sqrt(tl.sum(qi * qi, axis=1) + 1e-6)
            hat = ((start + rows) * n_h + h) * DW + m
            tl.store(kk + hat, dkk, mask=on)
            tl.store(qk + hat, dqk, mask=on)


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def tree_levels_kernel(
    q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, log_p,
    scale, n_slots, n_rows, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh, s_bn, s_bh,
    s_sn, s_sh, s_sv, s_on, s_oh, s_un, s_uh, s_ln,
    ancestors, kk, qk,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    TP: tl.constexpr, DW: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP
    n_h = n_hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)
    n_ok = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    rows = tl.arange(0, TP)
    rmask = rows < n_ok
    rows_g = start + rows
    neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)
    # logP and the path length (depth + 1) of every node by pointer jumping
    cur = valid_parents(parents, rows_g, rows, rmask)
    lp, _ = row_gates(g, beta, rows_g, rmask, hv, s_gn, s_gh, s_bn, s_bh, neg_a, bias, GATED, False)
    span = tl.where(rmask, 1, 0)
    while tl.max(cur, axis=0) >= 0:
        act = cur >= 0
        safe = tl.where(act, cur, 0)
        lp += tl.where(act, tl.gather(lp, safe, 0), 0.0)
        span += tl.where(act, tl.gather(span, safe, 0), 0)
        cur = tl.where(act, tl.gather(cur, safe, 0), -1)
    depth = span - 1
    deepest = tl.max(depth, axis=0)
    n_solved = tl.where(deepest < DW, n_ok, 0)  # deeper than the scratch holds: a broken promise
    n_poison = n_nodes - n_solved
    offs_v = iv * BV + tl.arange(0, BV)
    vmask = offs_v < V
    if n_solved > 0:
        if (iv == 0):
            tl.store(log_p + rows_g * s_ln + hv, lp, mask=rmask)
        xs, ys, nk, nq = state_products(q, k, state, rows_g, rmask, h, hv, slot, offs_v, vmask, s_qn, s_qh, s_kn,
                                        s_kh, s_sn, s_sh, s_sv, K, KP, BK, TP, BV, USE_L2NORM, PRECISION)
        inv_k, inv_q = unit_scales(nk, nq, scale, USE_L2NORM)
        bt = tl.load(beta + rows_g * s_bn + hv * s_bh, mask=rmask, other=0.0).to(tl.float32)
        if GATED:  # (loaded here, after the state products: fewer registers live across them)
            bt = tl.where(rmask, tl.sigmoid(bt), 0.0)
        p = tl.exp(lp)
        tile = rmask[:, None] & vmask[None, :]
        vt = tl.load(v + rows_g[:, None] * s_vn + hv * s_vh + offs_v[None, :], mask=tile, other=0.0).to(tl.float32)
        uu = bt[:, None] * (vt - (p * inv_k)[:, None] * xs)
        out = (p * inv_q)[:, None] * ys
        u_at = u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :]
        for lvl in range(0, deepest):
            # the ancestor at depth lvl of every deeper node, and its products with the node:
            # independent of U, so fetched before the barrier
            deeper = rmask & (depth > lvl)
            j = tl.load(ancestors + rows_g * DW + (depth - lvl), mask=deeper, other=0)
            # an ancestor precedes its node: anything else (requests overlapping in
            # cu_seqlens, whose products launches share rows of the scratch) is not read
            deeper = deeper & (j >= 0) & (j < rows)
            j = tl.where(deeper, j, 0)
            hat = (rows_g * n_h + h) * DW + (depth - lvl)
            w = tl.where(deeper, tl.exp(tl.minimum(lp - tl.gather(lp, j, 0), 0.0)), 0.0)
            gk = bt * w * tl.load(kk + hat, mask=deeper, other=0.0)
            cq = w * tl.load(qk + hat, mask=deeper, other=0.0)
            # level lvl is final: written to `u`, read back after a barrier (through shared
            # memory by tl.gather instead: slower at 7 of 8 cells, H200, I17-m)
            tl.store(u_at, uu, mask=tile & (depth == lvl)[:, None])
            tl.debug_barrier()
            uj = tl.load(u + (start + j)[:, None] * s_un + hv * s_uh + offs_v[None, :],
                         mask=deeper[:, None] & vmask[None, :], other=0.0)
            uu -= gk[:, None] * uj
            out += cq[:, None] * uj
        self_qk = tl.load(qk + (rows_g * n_h + h) * DW, mask=rmask, other=0.0)
        out += self_qk[:, None] * uu
        tl.store(u_at, uu, mask=tile & (depth == deepest)[:, None])
        tl.store(o + rows_g[:, None] * s_on + hv * s_oh + offs_v[None, :], out.to(o.dtype.element_ty), mask=tile)
    poison_rows(o, u, log_p, start, n_poison, iv * BV, hv, s_on, s_oh, s_un, s_uh, s_ln, iv == 0,
                V, 32, BV, BV)


def levels_width(max_depth: int) -> int:
    """Columns of the level scratch for trees of at most max_depth strict ancestors: the
    node itself and each distance, rounded up to a power of two."""
    return max(2, triton.next_power_of_2(max_depth + 1))


def levels_scratch(n: int, h: int, dw: int) -> tuple:
    """((shape, dtype) of the ancestors [N, DW] int32, of k.k and q.k [2, N, H, DW] float32)."""
    return ((n, dw), torch.int32), ((2, n, h, dw), torch.float32)


def launch_levels(args: VerifyArgs, bsz: int, cfg: dict, dw: int, consts: dict) -> None:
    """The level-by-level verify of `bsz` requests: the ancestors and their products per key
    head, then the levels; `cfg` is levels_launch_config's (with RB), `dw` levels_width's,
    `consts` the shape constexprs (GROUP, K, V, KP, TP, USE_L2NORM, PRECISION, GATED). The
    scratch is allocated here."""
    q, k = args.q, args.k
    n, h = q.shape[0], q.shape[1]
    ancestors, (kk, qk) = (torch.empty(shape, device=q.device, dtype=dtype) for shape, dtype in levels_scratch(n, h, dw))
    tp, rb = consts["TP"], min(cfg["RB"], consts["TP"])
    levels_gram_kernel[(bsz, h, dw * (tp // rb))](
        q, k, args.state_idx, args.parents, args.cu, ancestors, kk, qk, args.scale, args.n_slots, args.n_rows, h,
        args.s_qn, args.s_qh, args.s_kn, args.s_kh, K=consts["K"], KP=consts["KP"], TP=tp, RB=rb, DW=dw,
        USE_L2NORM=consts["USE_L2NORM"], num_warps=cfg["gram_warps"])
    bv = min(cfg["BV"], triton.next_power_of_2(consts["V"]))
    tree_levels_kernel[(bsz, args.n_hv, triton.cdiv(consts["V"], bv))](
        *args, ancestors, kk, qk, DW=dw, BV=bv, BK=min(cfg["BK"], consts["KP"]), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **consts)
