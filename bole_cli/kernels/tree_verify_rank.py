"""Closed-form tree verify for big shallow trees (65-256 nodes, depth < FAST_TREE_DEPTH): the
ancestor-rank form, in two launches (issue 17, v12; measured history: experiments/NOTES.md
"Big trees").

A and C (docs/design.md §2) are nonzero only at (i, j) with j in A+(i), so per node they
are DS numbers, one per rank s (the ancestor p_s(i) s levels up; p_0 = i). Two kernels:

factors (one program per request and value head): for each node, from its own path only,
        G[i, p_s] = beta_i exp(logP_i - logP_{p_s}) k_i.k_{p_s} and C[i, p_s] likewise with q_i
        (the ancestors' k rows by gather loads; L2 norms from the same loads), written to a
        workspace [N, HV, 2, DS] and logP to log_p; then A's rows in place of G by forward
        substitution along each path, A[i, p_t] = -sum_{s<t} A[i, p_s] G[p_s, p_t] (exact,
        reading the ancestors' G rows), and Ce = C A in place of C.
values  (one program per request, value head, value tile): R = D_beta (V - D_P K S^T) into
        u, then, last chunk first (a row's R is overwritten by its U only after every
        descendant read it), U_i = sum_s A[i, s] R[p_s] and O_i = D_P Q_i S^T +
        sum_s Ce[i, s] R[p_s], the R rows by gather loads.

Nothing T x T exists anywhere: the tree work is O(T DS K) per head, once for all value
tiles, and the per-tile work is the state products plus DS row gathers. Requests that are
not shallow are left to the chain and blocked kernels (tree_verify.py), unless the caller
promised max_depth < DS (POISON_OTHER): then, like a slot outside the pool or a tree larger
than TP, their rows are NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from bole_cli.kernels.jit_math import chunk_ancestors, column, poison_rows, request_span, softplus, tree_kind


@triton.jit(do_not_specialize=["n_slots"])
def tree_rank_factors_kernel(
    q, k, g, beta, A_log, dt_bias, state_idx, parents, cu, log_p, ws,
    scale, n_slots,
    s_qn, s_qh, s_kn, s_kh, s_gn, s_gh, s_bn, s_bh, s_ln, s_wn, s_wh,
    GROUP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    TP: tl.constexpr, DS: tl.constexpr, USE_L2NORM: tl.constexpr, GATED: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots)
    valid = in_pool & (n_nodes <= TP)
    chain, depth, shallow = tree_kind(parents, start, tl.where(valid, n_nodes, 0), TP, DS)
    if valid & shallow:
        if GATED:  # g and beta hold SGLang's raw a and b: fuse the gates (as its verifier does)
            neg_a = -tl.exp(tl.load(A_log + hv).to(tl.float32))
            bias = tl.load(dt_bias + hv).to(tl.float32)
        cols = tl.arange(0, DS)
        lane = tl.arange(0, BC)
        g_tab = ws + hv * s_wh  # + node * s_wn + rank: G, then A
        c_tab = g_tab + DS      # C, then Ce
        n_chunks = tl.cdiv(n_nodes, BC)

        # G and C at each node's ancestors, and logP, from the node's own path
        for c in range(0, n_chunks):
            rows = c * BC + lane
            rmask = rows < n_nodes
            rows_g = start + rows
            anc = chunk_ancestors(parents, start, rows, rmask, depth, DS)
            has = anc >= 0
            nodes_g = start + tl.maximum(anc, 0)
            gp = tl.load(g + nodes_g * s_gn + hv * s_gh, mask=has, other=0.0).to(tl.float32)
            bi = tl.load(beta + rows_g * s_bn + hv * s_bh, mask=rmask, other=0.0).to(tl.float32)
            if GATED:
                gp = tl.where(has, neg_a * softplus(gp + bias), 0.0)
                bi = tl.where(rmask, tl.sigmoid(bi), 0.0)
            # logP_i - logP_{p_s} = the decays of p_0 .. p_(s-1): an exclusive prefix sum
            ratio = tl.where(has, tl.exp(tl.minimum(tl.cumsum(gp, axis=1) - gp, 0.0)), 0.0)
            kk = tl.zeros([BC, DS], dtype=tl.float32)
            qk = tl.zeros([BC, DS], dtype=tl.float32)
            na = tl.zeros([BC, DS], dtype=tl.float32)
            nk = tl.zeros([BC], dtype=tl.float32)
            nq = tl.zeros([BC], dtype=tl.float32)
            for kb in range(0, KP, BK):
                offs = kb + tl.arange(0, BK)
                kmask = (offs < K)[None, :]
                ki = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=rmask[:, None] & kmask,
                             other=0.0).to(tl.float32)
                qi = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=rmask[:, None] & kmask,
                             other=0.0).to(tl.float32)
                nk += tl.sum(ki * ki, axis=1)
                nq += tl.sum(qi * qi, axis=1)
                for s in tl.static_range(DS):  # unrolled: the gathers issue together
                    an = column(anc, s, DS)
                    ka = tl.load(k + (start + tl.maximum(an, 0))[:, None] * s_kn + h * s_kh + offs[None, :],
                                 mask=(an >= 0)[:, None] & kmask, other=0.0).to(tl.float32)
                    at = cols[None, :] == s
                    kk = tl.where(at, kk + tl.sum(ki * ka, axis=1)[:, None], kk)
                    qk = tl.where(at, qk + tl.sum(qi * ka, axis=1)[:, None], qk)
                    na = tl.where(at, na + tl.sum(ka * ka, axis=1)[:, None], na)
            if USE_L2NORM:
                ratio = ratio / tl.sqrt(na + 1e-6)
                kscale = bi / tl.sqrt(nk + 1e-6)
                qscale = scale / tl.sqrt(nq + 1e-6)
            else:
                kscale = bi
                qscale = tl.full([BC], 1.0, tl.float32) * scale
            gt = tl.where(has & (cols[None, :] > 0), kscale[:, None] * ratio * kk, 0.0)
            ct = qscale[:, None] * ratio * qk
            tmask = rmask[:, None] & (cols[None, :] < DS)
            tl.store(g_tab + rows_g[:, None] * s_wn + cols[None, :], gt, mask=tmask)
            tl.store(c_tab + rows_g[:, None] * s_wn + cols[None, :], ct, mask=tmask)
            tl.store(log_p + rows_g * s_ln + hv, tl.sum(gp, axis=1), mask=rmask)
        tl.debug_barrier()

        # A's rows in place of G, last chunk first (a row's G is read by its descendants only)
        for cc in range(0, n_chunks):
            rows = (n_chunks - 1 - cc) * BC + lane
            rmask = rows < n_nodes
            anc = chunk_ancestors(parents, start, rows, rmask, depth, DS)
            arow = tl.where((cols[None, :] == 0) & rmask[:, None], 1.0, 0.0)
            for s in tl.static_range(DS - 1):
                an = column(anc, s, DS)
                # G[p_s, p_t] is row p_s's rank t - s entry
                gsh = tl.load(g_tab + (start + tl.maximum(an, 0))[:, None] * s_wn + tl.maximum(cols - s, 0)[None, :],
                              mask=(an >= 0)[:, None] & (cols > s)[None, :], other=0.0)
                arow -= column(arow, s, DS)[:, None] * gsh
            tl.debug_barrier()  # this chunk's G rows are read (by the chunk itself) before A lands
            tl.store(g_tab + (start + rows)[:, None] * s_wn + cols[None, :], arow,
                     mask=rmask[:, None] & (cols[None, :] < DS))
        tl.debug_barrier()

        # Ce = C A in place of C: Ce[i, p_t] = sum_{s <= t} C[i, p_s] A[p_s, p_t]
        for c in range(0, n_chunks):
            rows = c * BC + lane
            rmask = rows < n_nodes
            rows_g = start + rows
            tmask = rmask[:, None] & (cols[None, :] < DS)
            anc = chunk_ancestors(parents, start, rows, rmask, depth, DS)
            ct = tl.load(c_tab + rows_g[:, None] * s_wn + cols[None, :], mask=tmask, other=0.0)
            ce = tl.zeros([BC, DS], dtype=tl.float32)
            for s in tl.static_range(DS):
                an = column(anc, s, DS)
                ash = tl.load(g_tab + (start + tl.maximum(an, 0))[:, None] * s_wn + tl.maximum(cols - s, 0)[None, :],
                              mask=(an >= 0)[:, None] & (cols >= s)[None, :], other=0.0)
                ce += column(ct, s, DS)[:, None] * ash
            tl.store(c_tab + rows_g[:, None] * s_wn + cols[None, :], ce, mask=tmask)


@triton.jit
def _state_rows(a, state, rows_g, rmask, h, slot, hv, offs_v, vmask, s_an, s_ah, s_sn, s_sh, s_sv,
                K: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                PRECISION: tl.constexpr):
    """(rows a_i^T S of a chunk for one value tile, raw; |a_i|^2) over key-dim slices."""
    acc = tl.zeros([BC, BV], dtype=tl.float32)
    sq = tl.zeros([BC], dtype=tl.float32)
    for kb in range(0, KP, BK):
        offs = kb + tl.arange(0, BK)
        kmask = (offs < K)[None, :]
        an = tl.load(a + rows_g[:, None] * s_an + h * s_ah + offs[None, :], mask=rmask[:, None] & kmask,
                     other=0.0).to(tl.float32)
        sb = tl.load(state + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs[None, :],
                     mask=vmask[:, None] & kmask, other=0.0).to(tl.float32)
        sq += tl.sum(an * an, axis=1)
        acc += tl.dot(an, tl.trans(sb), input_precision=PRECISION)
    return acc, sq


@triton.jit(do_not_specialize=["n_slots"])
def tree_rank_values_kernel(
    q, k, v, beta, state, state_idx, parents, cu, o, u, log_p, ws,
    scale, n_slots,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_bn, s_bh,
    s_sn, s_sh, s_sv, s_on, s_oh, s_un, s_uh, s_ln, s_wn, s_wh,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
    BC: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr, DS: tl.constexpr,
    POISON_OTHER: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots)
    valid = in_pool & (n_nodes <= TP)
    chain, depth, shallow = tree_kind(parents, start, tl.where(valid, n_nodes, 0), TP, DS)
    if valid & shallow:
        cols = tl.arange(0, DS)
        lane = tl.arange(0, BC)
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        a_tab = ws + hv * s_wh
        ce_tab = a_tab + DS
        n_chunks = tl.cdiv(n_nodes, BC)
        # R = D_beta (V - D_P K S^T) into u
        for c in range(0, n_chunks):
            rows = c * BC + lane
            rmask = rows < n_nodes
            rows_g = start + rows
            xs, nk = _state_rows(k, state, rows_g, rmask, h, slot, hv, offs_v, vmask, s_kn, s_kh, s_sn, s_sh, s_sv,
                                 K, KP, BC, BV, BK, PRECISION)
            p = tl.exp(tl.load(log_p + rows_g * s_ln + hv, mask=rmask, other=0.0))
            if USE_L2NORM:
                p = p / tl.sqrt(nk + 1e-6)
            bi = tl.load(beta + rows_g * s_bn + hv * s_bh, mask=rmask, other=0.0).to(tl.float32)
            if GATED:
                bi = tl.where(rmask, tl.sigmoid(bi), 0.0)
            vc = tl.load(v + rows_g[:, None] * s_vn + hv * s_vh + offs_v[None, :],
                         mask=rmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
            tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], bi[:, None] * (vc - p[:, None] * xs),
                     mask=rmask[:, None] & vmask[None, :])
        tl.debug_barrier()  # every row's R is in u before the program reads rows back

        # U and O from the ancestors' R, last chunk first
        for cc in range(0, n_chunks):
            rows = (n_chunks - 1 - cc) * BC + lane
            rmask = rows < n_nodes
            rows_g = start + rows
            tmask = rmask[:, None] & (cols[None, :] < DS)
            anc = chunk_ancestors(parents, start, rows, rmask, depth, DS)
            at = tl.load(a_tab + rows_g[:, None] * s_wn + cols[None, :], mask=tmask, other=0.0)
            cet = tl.load(ce_tab + rows_g[:, None] * s_wn + cols[None, :], mask=tmask, other=0.0)
            ys, nq = _state_rows(q, state, rows_g, rmask, h, slot, hv, offs_v, vmask, s_qn, s_qh, s_sn, s_sh, s_sv,
                                 K, KP, BC, BV, BK, PRECISION)
            pq = tl.exp(tl.load(log_p + rows_g * s_ln + hv, mask=rmask, other=0.0)) * scale
            if USE_L2NORM:
                pq = pq / tl.sqrt(nq + 1e-6)
            out = pq[:, None] * ys
            uu = tl.zeros([BC, BV], dtype=tl.float32)
            for s in tl.static_range(DS):  # unrolled: the row gathers issue together
                an = column(anc, s, DS)
                rr = tl.load(u + (start + tl.maximum(an, 0))[:, None] * s_un + hv * s_uh + offs_v[None, :],
                             mask=(an >= 0)[:, None] & vmask[None, :], other=0.0)
                uu += column(at, s, DS)[:, None] * rr
                out += column(cet, s, DS)[:, None] * rr
            tl.debug_barrier()  # this chunk's rows are read (by the chunk itself) before U lands
            tile = rmask[:, None] & vmask[None, :]
            tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], uu, mask=tile)
            tl.store(o + rows_g[:, None] * s_on + hv * s_oh + offs_v[None, :], out.to(o.dtype.element_ty), mask=tile)
    elif (valid == 0) | ((shallow == 0) & (POISON_OTHER != 0)):
        # a slot outside the pool, a broken max_nodes or max_depth promise: NaN rows
        poison_rows(o, u, log_p, start, n_nodes, iv * BV, hv, s_on, s_oh, s_un, s_uh, s_ln, iv == 0,
                    V, BC, BV, BV)
