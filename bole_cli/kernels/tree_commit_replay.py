"""Replay commit (docs/design.md §2, "Replay commit"): the state after the accepted node,
rebuilt in float32 from the pre-tree state and the accepted path's inputs (k, v, g, beta),
not from the verify's u. The committed state is then exact to float32 whatever precision
the verify's dots ran at: the verify's outputs may use tf32 (they land at the bf16 rounding
floor) while the state takes no tf32 rounding. It is the contract SGLang serves speculative
decoding with (its ReplaySSM fold replays the accepted prefix; docs/design.md §9).

The path is a chain, so DP of its nodes at a time (root first) solve the chain's own system
against the state S before them, the state carried in registers:

    W = K^ S^T,  R = D_beta (V - D_P W),  U = (I + G)^-1 R,  S <- P_last S + sum_j (P_last/P_j) u_j k^_j^T

exactly, in float32: raw 16-bit keys are exact in tf32, so K S^T and the update U^T K take
tf32x3 (its dropped low x low term is zero) and the Gram K K^T one tf32 pass; the inverse
merges blocks in float32 (jit_math.inverse_by_blocks). The step-by-step recurrence in
registers (one node a step) measured 1.3-10x slower than Eq. 10's commit on the H200
(experiments/NOTES.md "Replay commit").

One program per (layer x request, value head, value tile); with a leading layer dimension
every GDN layer commits in ONE launch. The program walks the accepted node's ancestors once
(into a register vector, deepest first; the walk reads only `parents`), then loads each
pass's k, v, g, beta rows together. accepted = -1 leaves the request's slot untouched; so
does, without check_trees, a slot outside the pool, an accepted node outside the tree or a
path longer than the kernel's walk (docs/design.md §3).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.jit_math import commit_program, commit_target, gate_params, inverse_by_blocks, row_gates
from bole_cli.errors import InputError
from bole_cli.kernels.validate import (ACTIVATION_DTYPES, GATE_DTYPES, check_commit, check_config, check_last_contiguous,
                                       check_max_nodes, check_shape, check_tensor)
from bole_cli.limits import MAX_TREE_NODES


@triton.jit
def exact_dot(a, b, SPLIT_A: tl.constexpr, EXACT_KEYS: tl.constexpr, WDOT: tl.constexpr):
    """a @ b to float32 accuracy, where one operand is raw keys (16-bit: exact in tf32, when
    EXACT_KEYS) and the other (a when SPLIT_A, else b) float32. "split": that operand as a
    tf32 high part (its low 13 mantissa bits cleared) plus the rest, two tf32 passes whose
    products are exact but for the rest's rounding (~2^-21 of it); "tf32x3": Triton's three
    passes; "ieee": FMA. Without exact keys, "split" falls back to tf32x3."""
    if WDOT == "split" and EXACT_KEYS:
        if SPLIT_A:
            hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            out = tl.dot(hi, b, input_precision="tf32")
            out = tl.dot(a - hi, b, acc=out, input_precision="tf32")
        else:
            hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            out = tl.dot(a, hi, input_precision="tf32")
            out = tl.dot(a, b - hi, acc=out, input_precision="tf32")
    elif WDOT == "ieee":
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision="tf32x3")
    return out


@triton.jit(do_not_specialize=["n_slots"])
def _tree_commit_replay_kernel(
    state, state_idx, k, v, g, beta, A_log, dt_bias, parents, cu, accepted,
    n_req, n_slots,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_vl, s_vn, s_vh, s_gl, s_gn, s_bl, s_bn, s_al,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    DP: tl.constexpr, PMAX: tl.constexpr, USE_L2NORM: tl.constexpr, GATED: tl.constexpr,
    EXACT_KEYS: tl.constexpr, WDOT: tl.constexpr, RELOAD: tl.constexpr,
):
    layer, b, hv, iv, a = commit_program(accepted, n_req)
    if a >= 0:
        h = hv // GROUP
        neg_a, bias = gate_params(A_log + layer * s_al, dt_bias + layer * s_al, hv, GATED)
        start, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots)
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
        tile_mask = vmask[:, None] & kmask[None, :]
        # no value column is stored for a request outside the pool or its tree
        store_mask = (offs_v < tl.where(in_pool, V, 0))[:, None] & kmask[None, :]
        if not RELOAD:
            s = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)
        k_base = k + layer * s_kl + h * s_kh
        v_base = v + layer * s_vl + hv * s_vh
        g_base = g + layer * s_gl
        b_base = beta + layer * s_bl
        steps = tl.arange(0, DP)
        lower = steps[:, None] > steps[None, :]
        for p0 in range(0, length, DP):
            # DP path nodes, root first, against the state before them: the chain's own
            # system (I + G) U = D_beta (V - D_P K S^T), solved exactly (module docstring)
            pos = p0 + steps
            on = pos < length
            node = tl.sum(tl.where(dist[None, :] == (length - 1 - pos)[:, None], path[None, :], 0), axis=1)
            rows = start + node
            kr = tl.load(k_base + rows[:, None] * s_kn + offs_k[None, :],
                         mask=on[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            vj = tl.load(v_base + rows[:, None] * s_vn + offs_v[None, :],
                         mask=on[:, None] & vmask[None, :], other=0.0).to(tl.float32)
            gj, bj = row_gates(g_base, b_base, rows, on, hv, s_gn, 1, s_bn, 1, neg_a, bias, GATED, True)
            if USE_L2NORM:
                rn = 1.0 / tl.sqrt(tl.sum(kr * kr, axis=1) + 1e-6)
            else:
                rn = tl.full([DP], 1.0, tl.float32)
            lc = tl.cumsum(gj, axis=0)  # log decay from the pass's start state, node included
            # k_i . S rows: raw 16-bit keys are exact in tf32, so tf32x3's dropped term is zero
            if RELOAD:  # the state read as the dot's operand, not held in registers
                s = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)
            w = exact_dot(kr, tl.trans(s), False, EXACT_KEYS, WDOT) * rn[:, None]
            r = bj[:, None] * (vj - tl.exp(lc)[:, None] * w)
            gram = tl.dot(kr, tl.trans(kr), input_precision="tf32" if EXACT_KEYS else "tf32x3")
            gram = gram * rn[:, None] * rn[None, :]
            gmat = tl.where(lower & on[:, None], bj[:, None] * tl.exp(tl.minimum(lc[:, None] - lc[None, :], 0.0)) * gram,
                            0.0)
            inv = inverse_by_blocks(gmat, steps, tl.minimum(DP, length - p0), "ieee")
            u = tl.dot(inv, r, input_precision="ieee")
            lc_end = tl.sum(tl.where(steps == tl.minimum(DP, length - p0) - 1, lc, 0.0), axis=0)
            wt = tl.where(on, tl.exp(lc_end - lc) * rn, 0.0)
            upd = exact_dot(tl.trans(u * wt[:, None]), kr, True, EXACT_KEYS, WDOT)
            if RELOAD:  # each pass writes its state (read back by the next, after a barrier)
                s_new = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32) * tl.exp(lc_end) + upd
                tl.store(s_ptr, s_new.to(state.dtype.element_ty), mask=store_mask)
                tl.debug_barrier()
            else:
                s = s * tl.exp(lc_end) + upd
        if not RELOAD:
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
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Commit each request's accepted node into `state` in place by replaying its path (and
    return `state`).

    The verify's inputs, not its factors: k [N, H, K] (raw; L2-normalised here when asked,
    as tree_verify does), v [N, HV, V], g and beta [N, HV] (float32 or the activation
    dtype). state [S, HV, V, K]; a leading layer dimension on state, k, v, g and beta ([L,
    S, HV, V, K], [L, N, ...]) commits L layers in one launch. accepted [B], the local index
    of the deepest accepted node, -1 for none. max_nodes promises the largest request (its
    path walk is sized by it; a longer path leaves the slot untouched), as for tree_verify.

    With check_trees, a slot outside [0, S) and two committing requests (accepted >= 0)
    sharing a slot are InputErrors naming state_indices. Without it (CUDA graphs) the kernel
    skips a request whose slot lies outside the pool or whose accepted node lies outside its
    tree; shared commit slots are then undefined (docs/design.md §3).
    """
    rows = {"v": (v, ACTIVATION_DTYPES), "g": (g, GATE_DTYPES), "beta": (beta, GATE_DTYPES)}
    return _replay(state, state_indices, k, v, g, beta, None, None, parents, cu_seqlens, accepted, rows,
                   use_qk_l2norm, check_trees, max_nodes, config)


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
        check_last_contiguous(name, t)
    if A_log.shape != dt_bias.shape:
        raise InputError(f"dt_bias: shape {tuple(dt_bias.shape)} differs from A_log's {tuple(A_log.shape)}")
    return _replay(state, state_indices, k, v, a, b, A_log, dt_bias, parents, cu_seqlens, accepted, rows,
                   use_qk_l2norm, check_trees, max_nodes, config)


def _replay(state, state_indices, k, v, g, beta, A_log, dt_bias, parents, cu_seqlens, accepted, rows,
            use_qk_l2norm, check_trees, max_nodes, config) -> torch.Tensor:
    c = check_commit(state, state_indices, k, rows, parents, cu_seqlens, accepted, use_qk_l2norm, check_trees)
    check_config("tree_commit_replay", config)
    n_layers = state.shape[0] if c.lead else 1
    if c.bsz == 0 or c.n == 0 or n_layers == 0 or c.n_slots == 0:
        return state
    widest = min(c.n, MAX_TREE_NODES) if max_nodes is None else check_max_nodes(max_nodes)
    cfg = launch_config("tree_commit_replay", {"K": c.kdim, "V": c.vdim, "HV": c.hv, "B": c.bsz, "L": n_layers},
                        config)
    bv = min(cfg["BV"], max(16, triton.next_power_of_2(c.vdim)))
    gated = A_log is not None
    one = (lambda t: t[0]) if c.lead else (lambda t: t)
    lstr = [t.stride(0) if c.lead else 0 for t in (state, k, v, g, beta)]
    st, kk, vv, gg, bb = (one(t) for t in (state, k, v, g, beta))
    if not gated:
        A_log = dt_bias = g  # never read
    _tree_commit_replay_kernel[(n_layers * c.bsz, c.hv, triton.cdiv(c.vdim, bv))](
        state, c.state_indices, k, v, g, beta, A_log, dt_bias, c.parents, c.cu_seqlens, c.accepted,
        c.bsz, c.n_slots,
        lstr[0], st.stride(0), st.stride(1), st.stride(2), lstr[1], kk.stride(0), kk.stride(1),
        lstr[2], vv.stride(0), vv.stride(1), lstr[3], gg.stride(0), lstr[4], bb.stride(0),
        A_log.stride(0) if gated and A_log.dim() > 1 else 0,
        GROUP=c.hv // c.h, K=c.kdim, V=c.vdim, KP=max(16, triton.next_power_of_2(c.kdim)), BV=bv, DP=cfg["DP"],
        PMAX=max(2, triton.next_power_of_2(widest)), USE_L2NORM=use_qk_l2norm, GATED=gated,
        EXACT_KEYS=k.element_size() == 2, WDOT=cfg["WDOT"], RELOAD=bool(cfg["RELOAD"]),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return state
