"""Replay commit (docs/design.md §2, "Replay commit"): the state after the accepted node,
rebuilt in float32 from the pre-tree state and the accepted path's inputs (k, v, g, beta),
not from the verify's u. The committed state is then exact to float32 whatever precision
the verify's dots ran at: the verify's outputs may use tf32 (they land at the bf16 rounding
floor) while the state takes no tf32 rounding. It is the contract SGLang serves speculative
decoding with (its ReplaySSM fold replays the accepted prefix; docs/design.md §9).

The path is replayed node by node, root first, as the recurrence itself:

    S <- exp(g_j) S;  u_j = beta_j (v_j - S k^_j);  S <- S + u_j k^_j^T

in float32 elementwise arithmetic (no tensor-core dot), the state tile [BV, K] in registers
with K across a warp's lanes, so k . S is a reduction inside one warp and the update one FMA
an element. One warp a program and value tiles of 16 keep many programs on each SM, so the
state's read and write stream at close to Eq. 10's commit (H200: 652 against 455 us for 24
layers at batch 16, where the chain's own system solved 16 nodes a pass took 1581;
experiments/NOTES.md "Replay commit, node by node").

One program per (layer x request, value head, value tile); with a leading layer dimension
every GDN layer commits in ONE launch. The program walks the accepted node's ancestors in
registers over the request's parents (deepest first), then steps root first, each step's
k, v, g, beta rows loaded a step ahead. accepted = -1 leaves the request's slot untouched;
so does, without check_trees, a slot outside the pool, an accepted node outside the tree,
or one past the walk (max_nodes rounded up to a power of two; docs/design.md §3).

Paths of more than limits.REPLAY_STEP_PATH nodes (long chains) wait on a row's load every
step; they take the passes kernel (tree_commit_replay_passes.py) in a second launch, which
a max_nodes or max_depth promise keeping every path within that length spares.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.jit_math import commit_program, commit_target, gate_params, row_gates
from bole_cli.errors import InputError
from bole_cli.kernels.validate import (ACTIVATION_DTYPES, GATE_DTYPES, check_commit, check_config,
                                       check_max_depth, check_max_nodes, check_shape, check_tensor)
from bole_cli.kernels.tree_commit_replay_passes import launch_passes
from bole_cli.limits import MAX_TREE_NODES, REPLAY_CONST_ROW_PATH, REPLAY_GATES_FIRST_PMAX, REPLAY_STEP_PATH


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def _tree_commit_replay_kernel(
    state, state_idx, k, v, g, beta, A_log, dt_bias, parents, cu, accepted,
    n_req, n_slots, n_rows,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_vl, s_vn, s_vh, s_gl, s_gn, s_bl, s_bn, s_al,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    PMAX: tl.constexpr, WALK: tl.constexpr, USE_L2NORM: tl.constexpr, GATED: tl.constexpr,
    GATES_FIRST: tl.constexpr, SV: tl.constexpr,
):
    layer, b, hv, iv, a = commit_program(accepted, n_req, n_rows)
    if a >= 0:
        h = hv // GROUP
        neg_a, bias = gate_params(A_log + layer * s_al, dt_bias + layer * s_al, hv, GATED)
        start, n_nodes, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)
        # The accepted path, deepest first, walked in registers over the request's parents
        # (one load of at most PMAX entries, not one dependent load a node)
        dist = tl.arange(0, PMAX)
        par = tl.load(parents + start + dist, mask=dist < n_nodes, other=-1).to(tl.int32)
        path = tl.zeros([PMAX], dtype=tl.int32)
        cur = a
        length = 0
        while (cur >= 0) & (length < WALK):
            path = tl.where(dist == length, cur, path)
            nxt = tl.sum(tl.where(dist == cur, par, 0), axis=0)
            cur = tl.where(nxt < cur, nxt, -1)
            length += 1
        # a path longer than WALK nodes (the passes kernel's, or no tree of the contract), or an
        # accepted node past the walk's PMAX parents (a broken max_nodes promise): no write here
        in_pool = in_pool & (cur < 0) & (a < PMAX)
        length = tl.where(in_pool, length, 0)  # nothing to replay for a request that is not written

        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        row_stride = SV if SV else s_sv  # SV: the launch's constant row stride, where it sets one
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * row_stride + offs_k[None, :]
        s = tl.load(s_ptr, mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        k_base = k + layer * s_kl + h * s_kh + offs_k
        v_base = v + layer * s_vl + hv * s_vh + offs_v
        g_base = g + layer * s_gl
        b_base = beta + layer * s_bl
        row = start + tl.sum(tl.where(dist == length - 1, path, 0), axis=0)  # the root's row
        kt = tl.load(k_base + row * s_kn, mask=kmask, other=0.0).to(tl.float32)
        vt = tl.load(v_base + row * s_vn, mask=vmask, other=0.0).to(tl.float32)
        if GATES_FIRST:  # the whole path's gates at once, each step picks its pair
            g_all, b_all = row_gates(g_base, b_base, start + path, dist < length, hv, s_gn, 1, s_bn, 1, neg_a,
                                     bias, GATED, True)
            gt = tl.sum(tl.where(dist == length - 1, g_all, 0.0), axis=0)
            bt = tl.sum(tl.where(dist == length - 1, b_all, 0.0), axis=0)
        else:  # each node's gates loaded with its rows, a step ahead
            gt, bt = row_gates(g_base, b_base, row, row >= 0, hv, s_gn, 1, s_bn, 1, neg_a, bias, GATED, True)
        for t in range(0, length):
            # the next node's rows first (their loads overlap this step's arithmetic)
            nxt_at = dist == length - 2 - t
            nrow = start + tl.sum(tl.where(nxt_at, path, 0), axis=0)
            n_more = tl.sum(nxt_at.to(tl.int32), axis=0)  # 1 while a node follows this one
            more = n_more > 0
            kn = tl.load(k_base + nrow * s_kn, mask=offs_k < K * n_more, other=0.0).to(tl.float32)
            vn = tl.load(v_base + nrow * s_vn, mask=offs_v < tl.where(more, V, 0), other=0.0).to(tl.float32)
            if GATES_FIRST:
                gn = tl.sum(tl.where(nxt_at, g_all, 0.0), axis=0)
                bn = tl.sum(tl.where(nxt_at, b_all, 0.0), axis=0)
            else:
                gn, bn = row_gates(g_base, b_base, nrow, more, hv, s_gn, 1, s_bn, 1, neg_a, bias, GATED, True)
            if USE_L2NORM:
                kt = kt / tl.sqrt(tl.sum(kt * kt, axis=0) + 1e-6)
            s = s * tl.exp(gt)
            ut = bt * (vt - tl.sum(s * kt[None, :], axis=1))
            s = s + ut[:, None] * kt[None, :]
            kt, vt, gt, bt = kn, vn, gn, bn
        # no value column is stored for a request outside the pool or its tree
        store_mask = (offs_v < tl.where(in_pool, V, 0))[:, None] & kmask[None, :]
        tl.store(s_ptr, s.to(state.dtype.element_ty), mask=store_mask)


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
    max_nodes: Optional[int] = None,
    max_depth: Optional[int] = None,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Commit each request's accepted node into `state` in place by replaying its path (and
    return `state`).

    The verify's inputs, not its factors: k [N, H, K] (raw; L2-normalised here when asked,
    as tree_verify does), v [N, HV, V], g and beta [N, HV] (float32 or the activation
    dtype). state [S, HV, V, K]; a leading layer dimension on state, k, v, g and beta ([L,
    S, HV, V, K], [L, N, ...]) commits L layers in one launch. accepted [B], the local index
    of the deepest accepted node, -1 for none. max_nodes promises the largest request, as for
    tree_verify (the path walk is sized by it, rounded up to a power of two; an accepted node
    past that leaves the slot untouched). max_depth promises the most strict ancestors of any
    node: with every path within limits.REPLAY_STEP_PATH nodes, by it or by max_nodes, one
    launch replays them all node by node; otherwise a second launch takes the longer paths
    DP nodes a pass (tree_commit_replay_passes.py). A broken max_depth promise costs time,
    never exactness.

    With check_trees, a slot outside [0, S) and two committing requests (accepted >= 0)
    sharing a slot are InputErrors naming state_indices. Without it (CUDA graphs) the kernel
    skips a request whose slot lies outside the pool or whose accepted node lies outside its
    tree; shared commit slots are then undefined (docs/design.md §3).
    """
    rows = {"v": (v, ACTIVATION_DTYPES), "g": (g, GATE_DTYPES), "beta": (beta, GATE_DTYPES)}
    return _replay(state, state_indices, k, v, g, beta, None, None, parents, cu_seqlens, accepted, rows,
                   use_qk_l2norm, check_trees, max_nodes, max_depth, config)


def tree_commit_replay_gated(
    state: torch.Tensor,
    state_indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    accepted: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
    check_trees: bool = True,
    max_nodes: Optional[int] = None,
    max_depth: Optional[int] = None,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """tree_commit_replay with the gates fused in, as tree_verify_gated takes them: a, b
    [N, HV] raw (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), SGLang's), A_log
    and dt_bias [HV] (or [L, HV] with a layer dimension, one row a layer)."""
    rows = {"a": (a, ACTIVATION_DTYPES), "b": (b, ACTIVATION_DTYPES), "v": (v, ACTIVATION_DTYPES)}
    lead = tuple(state.shape[:state.dim() - 4])
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if not isinstance(t, torch.Tensor) or t.dim() not in (1, 1 + len(lead)):
            raise InputError(f"{name}: expected [HV] or [L, HV], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        check_tensor(name, t, t.dim(), ACTIVATION_DTYPES, state.device)
        check_shape(name, t, (lead if t.dim() > 1 else ()) + (state.shape[-3],))
    if A_log.shape != dt_bias.shape:
        raise InputError(f"dt_bias: shape {tuple(dt_bias.shape)} differs from A_log's {tuple(A_log.shape)}")
    # The kernel reads both as raw memory with A_log's layer stride: a strided view is copied
    # (on the device, no sync; a no-op for the contiguous tensors the runtime passes).
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    return _replay(state, state_indices, k, v, a, b, A_log, dt_bias, parents, cu_seqlens, accepted, rows,
                   use_qk_l2norm, check_trees, max_nodes, max_depth, config)


def const_row_stride(longest: int, row_stride: int) -> int:
    """The kernel's SV: the state's row stride as a compile-time constant where no path can
    exceed limits.REPLAY_CONST_ROW_PATH nodes (fewer registers, more programs an SM), else 0,
    the stride then an argument (faster for long paths; experiments/NOTES.md "The state's row
    stride a constant")."""
    return row_stride if longest <= REPLAY_CONST_ROW_PATH else 0


def _replay(state, state_indices, k, v, g, beta, A_log, dt_bias, parents, cu_seqlens, accepted, rows,
            use_qk_l2norm, check_trees, max_nodes, max_depth, config) -> torch.Tensor:
    c = check_commit(state, state_indices, k, rows, parents, cu_seqlens, accepted, use_qk_l2norm, check_trees)
    check_config("tree_commit_replay", config)
    n_layers = state.shape[0] if c.lead else 1
    if c.bsz == 0 or c.n == 0 or n_layers == 0 or c.n_slots == 0:
        return state
    widest = min(c.n, MAX_TREE_NODES) if max_nodes is None else check_max_nodes(max_nodes)
    longest = widest if check_max_depth(max_depth) is None else min(widest, max_depth + 1)
    # N: the promised nodes a request times B (a tuned table's buckets follow the walk's size)
    cfg = launch_config("tree_commit_replay", {"K": c.kdim, "V": c.vdim, "HV": c.hv, "B": c.bsz, "L": n_layers,
                                               "N": c.bsz * widest}, config)
    bv = min(cfg["BV"], triton.next_power_of_2(c.vdim))
    gated = A_log is not None
    one = (lambda t: t[0]) if c.lead else (lambda t: t)
    lstr = [t.stride(0) if c.lead else 0 for t in (state, k, v, g, beta)]
    st, kk, vv, gg, bb = (one(t) for t in (state, k, v, g, beta))
    if not gated:
        A_log = dt_bias = g  # never read
    args = (state, c.state_indices, k, v, g, beta, A_log, dt_bias, c.parents, c.cu_seqlens, c.accepted,
            c.bsz, c.n_slots, c.n,
            lstr[0], st.stride(0), st.stride(1), st.stride(2), lstr[1], kk.stride(0), kk.stride(1),
            lstr[2], vv.stride(0), vv.stride(1), lstr[3], gg.stride(0), lstr[4], bb.stride(0),
            A_log.stride(0) if gated and A_log.dim() > 1 else 0)
    pmax = max(2, triton.next_power_of_2(widest))
    both = longest > REPLAY_STEP_PATH  # a path may be long: the passes kernel takes those
    _tree_commit_replay_kernel[(n_layers * c.bsz, c.hv, triton.cdiv(c.vdim, bv))](
        *args, GROUP=c.hv // c.h, K=c.kdim, V=c.vdim, KP=max(16, triton.next_power_of_2(c.kdim)), BV=bv,
        PMAX=pmax, WALK=REPLAY_STEP_PATH if both else pmax, USE_L2NORM=use_qk_l2norm, GATED=gated,
        GATES_FIRST=pmax >= REPLAY_GATES_FIRST_PMAX,
        SV=const_row_stride(longest, st.stride(2)),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if both:
        launch_passes(args, n_layers=n_layers, bsz=c.bsz, hv=c.hv, group=c.hv // c.h, kdim=c.kdim, vdim=c.vdim,
                      pmax=pmax, use_l2norm=use_qk_l2norm, gated=gated, exact_keys=k.element_size() == 2,
                      shortest=REPLAY_STEP_PATH)
    return state
