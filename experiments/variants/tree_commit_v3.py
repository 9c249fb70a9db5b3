"""[bench variant v3, kept for comparison: path walked in registers, rank-1 updates unrolled]
Factorised commit (DESIGN.md §2, Eq. 10): the exact state after the accepted node.

    S_new = P_a S + sum_{j in A+(a)} exp(logP_a - logP_j) u_j k_j^T

computed in place on the state pool from the verify's factors (k, u, log_p), walking
only the accepted path. One program per (layer x request, value head, value tile): with a
leading layer dimension every GDN layer of the model commits in ONE launch. accepted = -1
leaves the request's slot untouched.
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
    NP: tl.constexpr, PB: tl.constexpr, USE_L2NORM: tl.constexpr,
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
        n_nodes = (tl.load(cu + b + 1) - start).to(tl.int32)
        slot = tl.load(state_idx + b).to(tl.int64)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
        tile_mask = vmask[:, None] & kmask[None, :]
        lp_base = log_p + layer * s_ll + hv
        lp_a = tl.load(lp_base + (start + a) * s_ln)
        acc = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32) * tl.exp(lp_a)
        # The request's parents in registers: the path walk is then register work, and
        # the path's k/u rows are fetched PB at a time with independent loads.
        nodes = tl.arange(0, NP)
        par = tl.load(parents + start + nodes, mask=nodes < n_nodes, other=-1).to(tl.int32)
        cur = a
        while cur >= 0:
            for _s in tl.static_range(PB):  # PB path nodes per pass; loads do not wait on the walk
                on = cur >= 0
                row = start + tl.maximum(cur, 0)  # past the root: a valid row, weighted 0
                kj = tl.load(k + layer * s_kl + row * s_kn + h * s_kh + offs_k, mask=kmask, other=0.0).to(tl.float32)
                if USE_L2NORM:
                    kj = kj / tl.sqrt(tl.sum(kj * kj, axis=0) + 1e-6)
                uj = tl.load(u + layer * s_ul + row * s_un + hv * s_uh + offs_v, mask=vmask, other=0.0)
                lpj = tl.load(lp_base + row * s_ln)
                w = tl.where(on, tl.exp(tl.minimum(lp_a - lpj, 0.0)), 0.0)
                acc += (w * uj)[:, None] * kj[None, :]
                nxt = tl.sum(tl.where(nodes == cur, par, 0), axis=0)
                cur = tl.where(on & (nxt < cur), nxt, -1)
        tl.store(s_ptr, acc.to(state.dtype.element_ty), mask=tile_mask)
