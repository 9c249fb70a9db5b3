"""Deferred commit (docs/design.md §2, "Deferred commit"): the accepted
path is kept as factors beside the written state instead of being written into it.

tree_commit reads and writes the whole state every step (3 passes over it per step with the
verify's read). Here a commit appends the accepted path's rows (unit k, u, log_p from the
written state) to the slot's pending rows, a few KiB, and the next verify reads the slot's
true state as exp(logP_end) S + sum_j exp(logP_end - logP_j) u_j k_j^T (the verify kernels
add the pending rows to each state slice they load). Only when the rows would overflow (or
on `tree_flush`) is the true state after the path written and the rows cleared: one state
write every few steps, as SGLang's ReplaySSM ring materialises its checkpoint.

One program per (layer x request, value head), looping over value tiles: the program that
reads a (slot, head)'s count is the one that writes it, so no launch-wide ordering is
needed. Key rows are written by the first value head of each key head. Without check_trees
(CUDA graphs) a slot outside the pool or an accepted node outside the tree leaves the slot
and its rows untouched; a count outside 0..L is read as clamped.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.types import PendingPath
from bole_cli.kernels.tree_commit import accepted_path_sum, commit_strides, layer_views
from bole_cli.kernels.validate import FACTOR_DTYPES, check_commit, check_config, check_flag, check_pending, check_pool_rank


@triton.jit
def _parent(parents, start, cur):
    nxt = tl.load(parents + start + cur).to(tl.int32)
    return tl.where(nxt < cur, nxt, -1)  # a parent that does not precede its child ends the path


@triton.jit(do_not_specialize=["n_slots", "room"])
def _tree_commit_deferred_kernel(
    state, state_idx, k, u, log_p, parents, cu, accepted, pend_k, pend_u, pend_lp, pend_n,
    n_req, n_slots, n_hv, room,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_ul, s_un, s_uh, s_ll, s_ln,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
    BV: tl.constexpr, DP: tl.constexpr, LP: tl.constexpr, LPP: tl.constexpr,
    USE_L2NORM: tl.constexpr, FLUSH: tl.constexpr,
):
    pid = tl.program_id(0)
    layer = (pid // n_req).to(tl.int64)
    b = pid % n_req
    hv = tl.program_id(1)
    h = hv // GROUP
    n_h = n_hv // GROUP
    start = tl.load(cu + b).to(tl.int64)
    n_nodes = (tl.load(cu + b + 1) - start).to(tl.int32)
    slot = tl.load(state_idx + b).to(tl.int64)
    in_pool = (slot >= 0) & (slot < n_slots)
    slot = tl.where(in_pool, slot, 0)
    a = tl.load(accepted + b).to(tl.int32)
    has_path = (a >= 0) & (a < n_nodes)
    count_at = pend_n + (layer * n_slots + slot) * n_hv + hv
    n = tl.minimum(tl.maximum(tl.load(count_at, mask=in_pool, other=0), 0), LP)
    if FLUSH:  # also a slot with rows and no path
        go = in_pool & (has_path | (n > 0))
    else:
        go = in_pool & has_path
    if go:
        row0 = (layer * n_slots + slot) * LP  # the slot's first row in the [L * S * LP] row space
        j = tl.arange(0, LPP)
        used = j < n
        plp = tl.load(pend_lp + (row0 + j) * n_hv + hv, mask=used, other=0.0)
        end = tl.sum(tl.where(j == n - 1, plp, 0.0), axis=0)  # logP_end, 0 with no rows
        a = tl.where(has_path, a, 0)
        lp_base = log_p + layer * s_ll + hv
        lp_a = tl.load(lp_base + (start + a) * s_ln, mask=has_path, other=0.0)
        d = n * 0  # the path's length (a dependent walk over `parents`, tiny and cache-resident)
        cur = tl.where(has_path, a, -1)
        while cur >= 0:
            d += 1
            cur = _parent(parents, start, cur)
        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        if n + d <= room:  # append the path, root first, after the slot's rows
            offs_vp = tl.arange(0, VP)
            cur = a
            i = n * 0
            while cur >= 0:
                row = row0 + n + d - 1 - i
                node = start + cur
                uj = tl.load(u + layer * s_ul + node * s_un + hv * s_uh + offs_vp, mask=offs_vp < V, other=0.0)
                tl.store(pend_u + (row * n_hv + hv) * V + offs_vp, uj, mask=offs_vp < V)
                tl.store(pend_lp + row * n_hv + hv, end + tl.load(lp_base + node * s_ln))
                if hv % GROUP == 0:  # one writer per key head
                    kj = tl.load(k + layer * s_kl + node * s_kn + h * s_kh + offs_k, mask=kmask, other=0.0)
                    kj = kj.to(tl.float32)
                    if USE_L2NORM:
                        kj = kj / tl.sqrt(tl.sum(kj * kj, axis=0) + 1e-6)
                    tl.store(pend_k + (row * n_h + h) * K + offs_k, kj, mask=kmask)
                cur = _parent(parents, start, cur)
                i += 1
            tl.store(count_at, n + d)
        else:  # write the true state after the path (Eq. 10 over the rows and the path)
            wp = tl.where(used, tl.exp(tl.minimum(end + lp_a - plp, 0.0)), 0.0)
            kp = tl.load(pend_k + ((row0 + j)[:, None] * n_h + h) * K + offs_k[None, :],
                         mask=used[:, None] & kmask[None, :], other=0.0)
            for v0 in range(0, V, BV):
                offs_v = v0 + tl.arange(0, BV)
                vmask = offs_v < V
                pu = tl.load(pend_u + ((row0 + j)[:, None] * n_hv + hv) * V + offs_v[None, :],
                             mask=used[:, None] & vmask[None, :], other=0.0)
                # float32 FMA ("ieee"), as tree_commit: the written state stays float32-exact
                acc = tl.dot(tl.trans(pu * wp[:, None]), kp, input_precision="ieee")  # [BV, KP]
                acc = accepted_path_sum(acc, k + layer * s_kl, u + layer * s_ul, lp_base, parents, start,
                                        tl.where(has_path, a, -1), lp_a, h, hv, offs_k, kmask, offs_v, vmask,
                                        s_kn, s_kh, s_un, s_uh, s_ln, DP, USE_L2NORM)
                s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
                tile = vmask[:, None] & kmask[None, :]
                s_old = tl.load(s_ptr, mask=tile, other=0.0).to(tl.float32)
                tl.store(s_ptr, (s_old * tl.exp(end + lp_a) + acc).to(state.dtype.element_ty), mask=tile)
            tl.store(count_at, 0)


def tree_commit_deferred(
    state: torch.Tensor,
    state_indices: torch.Tensor,
    k: torch.Tensor,
    u: torch.Tensor,
    log_p: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    accepted: torch.Tensor,
    pending: PendingPath,
    *,
    use_qk_l2norm: bool = True,
    check_trees: bool = True,
    flush: bool = False,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """tree_commit, deferred: append each request's accepted path (root first) to its slot's
    pending rows while they hold it, else write the slot's true state after the path into
    `state` and clear the rows (in place; returns `state`). flush=True writes every
    request's true state (after its path, if any) and clears its rows.

    Arguments as tree_commit (a leading layer dim commits every layer in one launch), plus
    `pending` (new_pending) with the same leading dim. With check_trees, bad slots,
    accepted nodes, shared commit slots and counts outside 0..L (or unequal across a slot's
    heads) are InputErrors; without it the kernel skips a slot outside the pool and the path
    of an accepted node outside the tree (with flush=True the slot's rows are still
    written), reads a count outside 0..L as clamped, and leaves a slot whose heads' counts
    disagree undefined. A slot's rows are only valid for the state they were appended to:
    write the slot (flush) before anything else reads or replaces its state.
    """
    check_flag("flush", flush)
    factors = {"u": (u, FACTOR_DTYPES), "log_p": (log_p, FACTOR_DTYPES)}
    c = check_commit(state, state_indices, k, factors, parents, cu_seqlens, accepted, use_qk_l2norm, check_trees,
                     every_slot_writes=flush)
    rows = check_pending(pending, c.lead, c.n_slots, c.h, c.kdim, c.hv, c.vdim, state.device, check_trees)
    check_config("tree_commit_deferred", config)
    n_layers = state.shape[0] if c.lead else 1
    if c.bsz == 0 or n_layers == 0 or c.n_slots == 0:
        return state

    cfg = launch_config("tree_commit_deferred", {"K": c.kdim, "V": c.vdim, "HV": c.hv, "B": c.bsz, "L": n_layers},
                        config)
    lstr, st, kk, uu, ll = layer_views(state, k, u, log_p, bool(c.lead))
    parents = c.parents
    if c.n == 0:  # no node to walk (a flush of pending rows alone): any row-shaped tensors do
        kk = kk.new_zeros((1,) + tuple(kk.shape[1:]))
        uu = uu.new_zeros((1,) + tuple(uu.shape[1:]))
        ll = ll.new_zeros((1,) + tuple(ll.shape[1:]))
        parents = parents.new_full((1,), -1)
        k, u, log_p, lstr = kk, uu, ll, (lstr[0], 0, 0, 0)
    vp = triton.next_power_of_2(c.vdim)
    _tree_commit_deferred_kernel[(n_layers * c.bsz, c.hv)](
        state, c.state_indices, k, u, log_p, parents, c.cu_seqlens, c.accepted, *pending,
        c.bsz, c.n_slots, c.hv, -1 if flush else rows, *commit_strides(lstr, st, kk, uu, ll),
        GROUP=c.hv // c.h, K=c.kdim, V=c.vdim, KP=triton.next_power_of_2(max(c.kdim, 16)), VP=vp,
        BV=min(cfg["BV"], vp), DP=cfg["DP"], LP=rows, LPP=max(16, triton.next_power_of_2(rows)),
        USE_L2NORM=use_qk_l2norm, FLUSH=flush, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return state


def tree_flush(state: torch.Tensor, pending: PendingPath, state_indices: Optional[torch.Tensor] = None,
               *, check_trees: bool = True) -> torch.Tensor:
    """Write the true state of `state_indices` (default: every slot) and clear their pending
    rows (in place; returns `state`): before a plain decode, a snapshot or a slot's reuse."""
    nd = check_pool_rank(state)
    if not isinstance(pending, tuple) or len(pending) != 4 or not isinstance(pending[0], torch.Tensor) \
            or pending[0].dim() < 2:
        raise InputError(f"pending: expected PendingPath(k, u, log_p, count), got {type(pending).__name__}")
    dev = state.device
    if state_indices is None:
        state_indices = torch.arange(state.shape[nd], device=dev)
    bsz = state_indices.shape[0] if isinstance(state_indices, torch.Tensor) and state_indices.dim() == 1 else 0
    lead = tuple(state.shape[:nd])
    h = pending.k.shape[-2]
    hv, vdim, kdim = state.shape[-3:]
    if h < 1 or hv % h:
        raise InputError(f"pending.k: {h} key heads do not divide the state's {hv} value heads")
    k = torch.zeros(lead + (0, h, kdim), device=dev, dtype=torch.float32)
    return tree_commit_deferred(state, state_indices, k, k.new_zeros(lead + (0, hv, vdim)),
                                k.new_zeros(lead + (0, hv)), torch.zeros(0, device=dev, dtype=torch.int64),
                                torch.zeros(bsz + 1, device=dev, dtype=torch.int64),
                                torch.full((bsz,), -1, device=dev, dtype=torch.int64), pending,
                                check_trees=check_trees, flush=True)
