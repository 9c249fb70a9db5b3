"""Factorised commit (DESIGN.md §2, Eq. 10): the exact state after the accepted node.

    S_new = P_a S + sum_{j in A+(a)} exp(logP_a - logP_j) u_j k_j^T

computed in place on the state pool from the verify's factors (k, u, log_p), walking
only the accepted path: DP path nodes at a time are found from `parents` alone, then their
k, u and log_p rows are loaded together and added with one float32 dot. One program per
(layer x request, value head, value tile): with a leading layer dimension every GDN layer
of the model commits in ONE launch. accepted = -1 leaves the request's slot untouched.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tree_commit_kernel(
    state, state_idx, k, u, log_p, parents, cu, accepted,
    n_req,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_ul, s_un, s_uh, s_ll, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    DP: tl.constexpr, USE_L2NORM: tl.constexpr,
):
    pid = tl.program_id(0)
    layer = (pid // n_req).to(tl.int64)
    b = pid % n_req
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    a = tl.load(accepted + b).to(tl.int32)
    if a >= 0:
        h = hv // GROUP
        start = tl.load(cu + b).to(tl.int64)
        slot = tl.load(state_idx + b).to(tl.int64)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
        tile_mask = vmask[:, None] & kmask[None, :]
        acc = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)  # in flight during the walk
        lp_base = log_p + layer * s_ll + hv
        lp_a = tl.load(lp_base + (start + a) * s_ln)
        acc = acc * tl.exp(lp_a)
        slots = tl.arange(0, DP)
        cur = a
        while cur >= 0:
            # DP path nodes: the walk reads only `parents` (tiny, cache-resident); the rows'
            # k, u and log_p are then fetched together instead of one dependent load a node.
            path = tl.full([DP], -1, tl.int32)
            i = 0
            while (i < DP) & (cur >= 0):
                path = tl.where(slots == i, cur, path)
                nxt = tl.load(parents + start + cur).to(tl.int32)
                cur = tl.where(nxt < cur, nxt, -1)
                i += 1
            on = path >= 0
            rows = start + tl.where(on, path, 0)
            kj = tl.load(k + layer * s_kl + rows[:, None] * s_kn + h * s_kh + offs_k[None, :],
                         mask=on[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            uj = tl.load(u + layer * s_ul + rows[:, None] * s_un + hv * s_uh + offs_v[None, :],
                         mask=on[:, None] & vmask[None, :], other=0.0)
            lpj = tl.load(lp_base + rows * s_ln, mask=on, other=0.0)
            w = tl.where(on, tl.exp(tl.minimum(lp_a - lpj, 0.0)), 0.0)
            if USE_L2NORM:
                w = w / tl.sqrt(tl.sum(kj * kj, axis=1) + 1e-6)
            # float32 FMA ("ieee"): the committed state stays float32-exact. tf32x3 (tensor
            # cores) was measured slower: 736 vs 498 us for 24 layers (H200, bench/NOTES.md)
            acc += tl.dot(tl.trans(uj * w[:, None]), kj, input_precision="ieee")
        tl.store(s_ptr, acc.to(state.dtype.element_ty), mask=tile_mask)
