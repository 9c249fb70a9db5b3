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

from bole_cli.errors import InputError
from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.validate import (
    ACTIVATION_DTYPES,
    STATE_DTYPES,
    check_accepted,
    check_commit_slots,
    check_config,
    check_flag,
    check_forest,
    check_index_vector,
    check_last_contiguous,
    check_nonempty,
    check_pool_slots,
    check_shape,
    check_tensor,
)


@triton.jit(do_not_specialize=["n_slots"])
def _tree_commit_kernel(
    state, state_idx, k, u, log_p, parents, cu, accepted,
    n_req, n_slots,
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
    # No host check keeps the pool safe under CUDA graphs: a slot outside the pool, or an
    # accepted node outside the tree, is clamped for the loads and its store masked off. (A
    # branch on the loaded slot instead costs 16%: 527 vs 448 us for 24 layers at batch 16,
    # H200, experiments/NOTES.md "commit guard".)
    if a >= 0:
        h = hv // GROUP
        start = tl.load(cu + b).to(tl.int64)
        slot = tl.load(state_idx + b).to(tl.int64)
        in_pool = (slot >= 0) & (slot < n_slots) & (a < tl.load(cu + b + 1) - start)
        slot = tl.where(in_pool, slot, 0)
        a = tl.where(in_pool, a, 0)
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
        path_sum = tl.zeros([BV, KP], dtype=tl.float32)
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
            # cores) was measured slower: 736 vs 498 us for 24 layers (H200, experiments/NOTES.md)
            path_sum += tl.dot(tl.trans(uj * w[:, None]), kj, input_precision="ieee")
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
    if not isinstance(state, torch.Tensor) or state.dim() not in (4, 5):
        raise InputError(f"state: expected [S, HV, V, K] or [L, S, HV, V, K], got "
                         f"{tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__}")
    dev = state.device
    layered = state.dim() == 5
    nd = 1 if layered else 0
    check_tensor("state", state, 4 + nd, STATE_DTYPES, dev)
    check_nonempty("state", state, {nd + 1: "HV (value heads)", nd + 2: "V (value dim)", nd + 3: "K (key dim)"})
    n_layers = state.shape[0] if layered else 1
    n_slots = state.shape[nd]
    hv, vdim, kdim = state.shape[-3:]
    check_tensor("k", k, 3 + nd, ACTIVATION_DTYPES, dev)
    check_tensor("u", u, 3 + nd, (torch.float32,), dev)
    check_tensor("log_p", log_p, 2 + nd, (torch.float32,), dev)
    n = k.shape[nd]
    h = k.shape[nd + 1]
    lead = (n_layers,) if layered else ()
    check_shape("k", k, lead + (n, h, kdim))
    check_shape("u", u, lead + (n, hv, vdim))
    check_shape("log_p", log_p, lead + (n, hv))
    check_nonempty("k", k, {nd + 1: "H (key heads)"})
    if hv % h:
        raise InputError(f"k: {h} key heads do not divide the state's {hv} value heads")
    for name, t in (("state", state), ("k", k), ("u", u), ("log_p", log_p)):
        check_last_contiguous(name, t)
    check_tensor("cu_seqlens", cu_seqlens, 1, None, dev)
    bsz = cu_seqlens.shape[0] - 1
    if bsz < 0:
        raise InputError("cu_seqlens: needs at least one entry")
    cu_seqlens = check_index_vector("cu_seqlens", cu_seqlens, bsz + 1, dev)
    state_indices = check_index_vector("state_indices", state_indices, bsz, dev)
    parents = check_index_vector("parents", parents, n, dev)
    check_flag("use_qk_l2norm", use_qk_l2norm)
    check_flag("check_trees", check_trees)
    check_config("tree_commit", config)
    if check_trees:
        check_forest(parents, cu_seqlens, n)
    accepted = check_accepted(accepted, cu_seqlens, dev, check_trees)
    if check_trees:
        check_pool_slots(state_indices, n_slots, check_trees, active=accepted >= 0)
        check_commit_slots(state_indices, accepted)
    if bsz == 0 or n == 0 or n_layers == 0 or n_slots == 0:
        return state

    cfg = launch_config("tree_commit", {"K": kdim, "V": vdim, "HV": hv, "B": bsz, "L": n_layers}, config)
    bv = min(cfg["BV"], triton.next_power_of_2(vdim))
    dp = cfg["DP"]
    if layered:
        lstr = (state.stride(0), k.stride(0), u.stride(0), log_p.stride(0))
        st, kk, uu, ll = state[0], k[0], u[0], log_p[0]
    else:
        lstr = (0, 0, 0, 0)
        st, kk, uu, ll = state, k, u, log_p
    grid = (n_layers * bsz, hv, triton.cdiv(vdim, bv))
    _tree_commit_kernel[grid](
        state, state_indices, k, u, log_p, parents, cu_seqlens, accepted,
        bsz, n_slots,
        lstr[0], st.stride(0), st.stride(1), st.stride(2),
        lstr[1], kk.stride(0), kk.stride(1),
        lstr[2], uu.stride(0), uu.stride(1),
        lstr[3], ll.stride(0),
        GROUP=hv // h, K=kdim, V=vdim, KP=triton.next_power_of_2(kdim), BV=bv, DP=dp,
        USE_L2NORM=use_qk_l2norm,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return state
