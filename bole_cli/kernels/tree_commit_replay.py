"""Replay commit (docs/design.md §2, "Replay commit"): the state after the accepted node,
rebuilt in float32 from the pre-tree state and the accepted path's inputs.

    for j on the path, root first:  S <- exp(g_j) S;  u_j = beta_j (v_j - S k_j);  S <- S + u_j k_j^T

This is the recurrence itself, in float32 elementwise arithmetic (no tensor-core dot), so
the committed state is exact to float32 whatever precision the verify's dots ran at: the
verify's outputs may use tf32 (they land at the bf16 rounding floor) while the state never
takes a tf32 rounding. It is the contract SGLang serves speculative decoding with (its
ReplaySSM fold replays the accepted prefix the same way; docs/design.md §9).

One program per (layer x request, value head, value tile); with a leading layer dimension
every GDN layer commits in ONE launch. The program walks the accepted node's ancestors
once (into a register vector, deepest first), then loads DP path rows at a time root
first (k, v, g, beta fetched together, not one dependent load a node) and steps through
them with the state tile in registers. accepted = -1 leaves the request's slot untouched;
so does, without check_trees, a slot outside the pool, an accepted node outside the tree
or a path longer than the kernel's walk (docs/design.md §3).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.validate import ACTIVATION_DTYPES, GATE_DTYPES, check_commit, check_config
from bole_cli.limits import MAX_TREE_NODES


@triton.jit(do_not_specialize=["n_slots"])
def _tree_commit_replay_kernel(
    state, state_idx, k, v, g, beta, parents, cu, accepted,
    n_req, n_slots,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_vl, s_vn, s_vh, s_gl, s_gn, s_bl, s_bn,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    DP: tl.constexpr, PMAX: tl.constexpr, USE_L2NORM: tl.constexpr,
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
        in_pool = (slot >= 0) & (slot < n_slots) & (a < tl.load(cu + b + 1) - start)
        slot = tl.where(in_pool, slot, 0)
        a = tl.where(in_pool, a, 0)
        # The accepted path, deepest first: path[i] is the accepted node's i-th ancestor.
        # The walk reads only `parents` (tiny, cache-resident).
        dist = tl.arange(0, PMAX)
        path = tl.zeros([PMAX], dtype=tl.int32)
        cur = a
        length = 0
        while (cur >= 0) & (length < PMAX):
            path = tl.where(dist == length, cur, path)
            nxt = tl.load(parents + start + cur).to(tl.int32)
            cur = tl.where(nxt < cur, nxt, -1)
            length += 1
        in_pool = in_pool & (cur < 0)  # a longer path is no tree of the contract: no write

        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
        s = tl.load(s_ptr, mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        k_base = k + layer * s_kl + h * s_kh
        v_base = v + layer * s_vl + hv * s_vh
        g_base = g + layer * s_gl + hv
        b_base = beta + layer * s_bl + hv
        steps = tl.arange(0, DP)
        for p0 in range(0, length, DP):
            pos = p0 + steps  # root-first positions of this pass
            on = pos < length
            node = tl.sum(tl.where(dist[None, :] == (length - 1 - pos)[:, None], path[None, :], 0), axis=1)
            rows = start + node
            kj = tl.load(k_base + rows[:, None] * s_kn + offs_k[None, :],
                         mask=on[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            vj = tl.load(v_base + rows[:, None] * s_vn + offs_v[None, :],
                         mask=on[:, None] & vmask[None, :], other=0.0).to(tl.float32)
            gj = tl.load(g_base + rows * s_gn, mask=on, other=0.0).to(tl.float32)
            bj = tl.load(b_base + rows * s_bn, mask=on, other=0.0).to(tl.float32)
            if USE_L2NORM:
                kj = kj / tl.sqrt(tl.sum(kj * kj, axis=1) + 1e-6)[:, None]
            for t in range(0, tl.minimum(DP, length - p0)):
                sel = steps == t
                kt = tl.sum(tl.where(sel[:, None], kj, 0.0), axis=0)
                vt = tl.sum(tl.where(sel[:, None], vj, 0.0), axis=0)
                s = s * tl.exp(tl.sum(tl.where(sel, gj, 0.0)))
                ut = tl.sum(tl.where(sel, bj, 0.0)) * (vt - tl.sum(s * kt[None, :], axis=1))
                s = s + ut[:, None] * kt[None, :]
        # no value column is stored for a request outside the pool or its tree
        store_mask = offs_v < tl.where(in_pool, V, 0)
        tl.store(s_ptr, s.to(state.dtype.element_ty), mask=store_mask[:, None] & kmask[None, :])


def tree_commit_replay(
    state: torch.Tensor,
    state_indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    accepted: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
    check_trees: bool = True,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Commit each request's accepted node into `state` in place by replaying its path (and
    return `state`).

    The verify's inputs, not its factors: k [N, H, K] (raw; L2-normalised here when asked,
    as tree_verify does), v [N, HV, V], g and beta [N, HV] (float32 or the activation
    dtype). state [S, HV, V, K]; a leading layer dimension on state, k, v, g and beta ([L,
    S, HV, V, K], [L, N, ...]) commits L layers in one launch. accepted [B], the local index
    of the deepest accepted node, -1 for none.

    With check_trees, a slot outside [0, S) and two committing requests (accepted >= 0)
    sharing a slot are InputErrors naming state_indices. Without it (CUDA graphs) the kernel
    skips a request whose slot lies outside the pool or whose accepted node lies outside its
    tree; shared commit slots are then undefined (docs/design.md §3).
    """
    rows = {"v": (v, ACTIVATION_DTYPES), "g": (g, GATE_DTYPES), "beta": (beta, GATE_DTYPES)}
    c = check_commit(state, state_indices, k, rows, parents, cu_seqlens, accepted, use_qk_l2norm, check_trees)
    check_config("tree_commit_replay", config)
    n_layers = state.shape[0] if c.lead else 1
    if c.bsz == 0 or c.n == 0 or n_layers == 0 or c.n_slots == 0:
        return state

    cfg = launch_config("tree_commit_replay", {"K": c.kdim, "V": c.vdim, "HV": c.hv, "B": c.bsz, "L": n_layers},
                        config)
    bv = min(cfg["BV"], triton.next_power_of_2(c.vdim))
    one = (lambda t: t[0]) if c.lead else (lambda t: t)
    lstr = [t.stride(0) if c.lead else 0 for t in (state, k, v, g, beta)]
    st, kk, vv, gg, bb = (one(t) for t in (state, k, v, g, beta))
    _tree_commit_replay_kernel[(n_layers * c.bsz, c.hv, triton.cdiv(c.vdim, bv))](
        state, c.state_indices, k, v, g, beta, c.parents, c.cu_seqlens, c.accepted,
        c.bsz, c.n_slots,
        lstr[0], st.stride(0), st.stride(1), st.stride(2), lstr[1], kk.stride(0), kk.stride(1),
        lstr[2], vv.stride(0), vv.stride(1), lstr[3], gg.stride(0), lstr[4], bb.stride(0),
        GROUP=c.hv // c.h, K=c.kdim, V=c.vdim, KP=triton.next_power_of_2(c.kdim), BV=bv, DP=cfg["DP"],
        PMAX=max(2, triton.next_power_of_2(min(c.n, MAX_TREE_NODES))), USE_L2NORM=use_qk_l2norm,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return state
