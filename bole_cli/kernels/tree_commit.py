"""Factorised commit (docs/design.md §2, Eq. 10): the exact state after the accepted node.

    S_new = P_a S + sum_{j in A+(a)} exp(logP_a - logP_j) u_j k_j^T

computed in place on the state pool from the verify's factors (k, u, log_p), walking
only the accepted path: DP path nodes at a time are found from `parents` alone, then their
k, u and log_p rows are loaded together and added with one float32 dot. One program per
(layer x request, value head, value tile): with a leading layer dimension every GDN layer
of the model commits in ONE launch. accepted = -1 leaves the request's slot untouched; so
does, without check_trees, a slot outside the pool or an accepted node outside the tree
(docs/design.md §3).

The path's sum is built in the dot's own register layout and the state tile is read only
when it is added: the tile then changes layout once, not twice, and stays out of registers
during the walk (H200, 24 layers at batch 16: 459 vs 498 us, experiments/NOTES.md c7).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.jit_math import commit_program, commit_target
from bole_cli.kernels.validate import FACTOR_DTYPES, check_commit, check_config


@triton.jit
def accepted_path_sum(acc, k, u, lp_base, parents, start, cur, lp_a, h, hv, offs_k, kmask, offs_v, vmask,
                      s_kn, s_kh, s_un, s_uh, s_ln, DP: tl.constexpr, USE_L2NORM: tl.constexpr):
    """acc + sum_{j in A+(cur)} exp(logP_a - logP_j) u_j k_j^T over value columns offs_v
    (nothing for cur = -1): the walk from node `cur` to its root, DP path nodes at a time."""
    slots = tl.arange(0, DP)
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
        kj = tl.load(k + rows[:, None] * s_kn + h * s_kh + offs_k[None, :],
                     mask=on[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        uj = tl.load(u + rows[:, None] * s_un + hv * s_uh + offs_v[None, :],
                     mask=on[:, None] & vmask[None, :], other=0.0)
        lpj = tl.load(lp_base + rows * s_ln, mask=on, other=0.0)
        w = tl.where(on, tl.exp(tl.minimum(lp_a - lpj, 0.0)), 0.0)
        if USE_L2NORM:
            w = w / tl.sqrt(tl.sum(kj * kj, axis=1) + 1e-6)
        # float32 FMA ("ieee"): the committed state stays float32-exact. tf32x3 (tensor
        # cores) was measured slower: 736 vs 498 us for 24 layers (H200, experiments/NOTES.md)
        acc += tl.dot(tl.trans(uj * w[:, None]), kj, input_precision="ieee")
    return acc


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def _tree_commit_kernel(
    state, state_idx, k, u, log_p, parents, cu, accepted,
    n_req, n_slots, n_rows,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_ul, s_un, s_uh, s_ll, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    DP: tl.constexpr, USE_L2NORM: tl.constexpr,
):
    layer, b, hv, iv, a = commit_program(accepted, n_req, n_rows)
    # No host check keeps the pool safe under CUDA graphs: a slot outside the pool, or an
    # accepted node outside the tree, is clamped for the loads and its store masked off. (A
    # branch on the loaded slot instead costs 16%: 527 vs 448 us for 24 layers at batch 16,
    # H200, experiments/NOTES.md "commit guard".)
    if a >= 0:
        h = hv // GROUP
        start, _, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        # no value column is stored for a request outside the pool or its tree
        store_mask = offs_v < tl.where(in_pool, V, 0)
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
        tile_mask = vmask[:, None] & kmask[None, :]
        lp_base = log_p + layer * s_ll + hv
        lp_a = tl.load(lp_base + (start + a) * s_ln)
        path_sum = accepted_path_sum(tl.zeros([BV, KP], dtype=tl.float32), k + layer * s_kl, u + layer * s_ul,
                                     lp_base, parents, start, a, lp_a, h, hv, offs_k, kmask, offs_v, vmask,
                                     s_kn, s_kh, s_un, s_uh, s_ln, DP, USE_L2NORM)
        s_old = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)
        tl.store(s_ptr, (s_old * tl.exp(lp_a) + path_sum).to(state.dtype.element_ty),
                 mask=store_mask[:, None] & kmask[None, :])


def tree_commit(
    state: torch.Tensor,
    state_indices: torch.Tensor,
    k: torch.Tensor,
    u: torch.Tensor,
    log_p: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    accepted: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
    check_trees: bool = True,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Commit each request's accepted node into `state` in place (and return `state`).

    state [S, HV, V, K] (or [L, S, HV, V, K] with k [L, N, H, K], u [L, N, HV, V],
    log_p [L, N, HV] to commit L layers in one launch); accepted [B], local node index
    of the deepest accepted node, -1 for none.

    With check_trees, a slot outside [0, S) and two committing requests (accepted >= 0)
    sharing a slot are InputErrors naming state_indices. Without it (CUDA graphs) the kernel
    skips a request whose slot lies outside the pool or whose accepted node lies outside its
    tree; shared commit slots are then undefined (docs/design.md §3).
    """
    factors = {"u": (u, FACTOR_DTYPES), "log_p": (log_p, FACTOR_DTYPES)}
    c = check_commit(state, state_indices, k, factors, parents, cu_seqlens, accepted, use_qk_l2norm, check_trees)
    check_config("tree_commit", config)
    n_layers = state.shape[0] if c.lead else 1
    if c.bsz == 0 or c.n == 0 or n_layers == 0 or c.n_slots == 0:
        return state

    cfg = launch_config("tree_commit", {"K": c.kdim, "V": c.vdim, "HV": c.hv, "B": c.bsz, "L": n_layers}, config)
    bv = min(cfg["BV"], triton.next_power_of_2(c.vdim))
    lstr, st, kk, uu, ll = layer_views(state, k, u, log_p, bool(c.lead))
    _tree_commit_kernel[(n_layers * c.bsz, c.hv, triton.cdiv(c.vdim, bv))](
        state, c.state_indices, k, u, log_p, c.parents, c.cu_seqlens, c.accepted,
        c.bsz, c.n_slots, c.n, *commit_strides(lstr, st, kk, uu, ll),
        GROUP=c.hv // c.h, K=c.kdim, V=c.vdim, KP=triton.next_power_of_2(c.kdim), BV=bv, DP=cfg["DP"],
        USE_L2NORM=use_qk_l2norm,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return state


def layer_views(state, k, u, log_p, layered: bool):
    """(layer strides of state, k, u, log_p (0 without a layer dim), and one layer of each):
    a commit kernel adds layer * stride and indexes the rest like one layer."""
    if layered:
        return (state.stride(0), k.stride(0), u.stride(0), log_p.stride(0)), state[0], k[0], u[0], log_p[0]
    return (0, 0, 0, 0), state, k, u, log_p


def commit_strides(lstr, st, kk, uu, ll) -> tuple:
    """The commit kernels' stride arguments, in their order."""
    return (lstr[0], st.stride(0), st.stride(1), st.stride(2), lstr[1], kk.stride(0), kk.stride(1),
            lstr[2], uu.stride(0), uu.stride(1), lstr[3], ll.stride(0))
