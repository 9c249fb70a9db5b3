"""Variant c8 (bench only, measured no faster than c7 in run 22): the request's parents
loaded once into registers, the path walked by a reduction a level."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tree_commit_kernel(
    state, state_idx, k, u, log_p, parents, cu, accepted,
    n_req,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_ul, s_un, s_uh, s_ll, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    DP: tl.constexpr, TN: tl.constexpr, USE_L2NORM: tl.constexpr,
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
        # the request's parents, held in registers: the walk below then costs a reduction
        # a level instead of a dependent global load a level
        nodes = tl.arange(0, TN)
        par = tl.load(parents + start + nodes, mask=nodes < (tl.load(cu + b + 1) - start), other=-1).to(tl.int32)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
        tile_mask = vmask[:, None] & kmask[None, :]
        lp_base = log_p + layer * s_ll + hv
        lp_a = tl.load(lp_base + (start + a) * s_ln)
        path_sum = tl.zeros([BV, KP], dtype=tl.float32)
        slots = tl.arange(0, DP)
        cur = a
        while cur >= 0:
            # DP path nodes from the parents in registers; the rows' k, u and log_p are then
            # fetched together instead of one dependent load a node.
            path = tl.full([DP], -1, tl.int32)
            i = 0
            while (i < DP) & (cur >= 0):
                path = tl.where(slots == i, cur, path)
                nxt = tl.sum(tl.where(nodes == cur, par, 0), axis=0)
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
            path_sum += tl.dot(tl.trans(uj * w[:, None]), kj, input_precision="ieee")
        s_old = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)
        tl.store(s_ptr, (s_old * tl.exp(lp_a) + path_sum).to(state.dtype.element_ty), mask=tile_mask)
