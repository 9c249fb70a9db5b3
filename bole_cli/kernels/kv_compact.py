"""A verify's commit for the full-attention layers: each request's accepted path moved from
its scratch (the tree's keys and values at base + local index) to base + depth, in every
attention layer, in one launch.

Why: done with tensor ops it is a gather of the path, index arithmetic and two indexed
writes, some twenty launches a verify step (docs/design.md §8). One program a (layer,
request, head) walks the path in order of depth: the ancestor at depth d has a local
index of at least d, and the indices grow along the path, so a move never overwrites a
position a later move of the same path still reads, and programs share no position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import check_index_vector, check_last_contiguous, check_tensor


@triton.jit(do_not_specialize=["n_slots", "n_nodes", "max_len"])
def _kv_compact_kernel(k_cache, v_cache, slots, base, accepted, cu, path_table, n_slots, n_nodes, max_len,
                       s_kl, s_ks, s_kh, s_kp, s_vl, s_vs, s_vh, s_vp, s_pn,
                       H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DEPTH: tl.constexpr):
    """Program (layer, request b x head h): its key and value rows along b's accepted path."""
    layer = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    slot = tl.load(slots + b).to(tl.int64)
    node = tl.load(accepted + b).to(tl.int64)
    first = tl.load(cu + b).to(tl.int64) + node
    bs = tl.load(base + b).to(tl.int64)
    ok = (slot >= 0) & (slot < n_slots) & (node >= 0) & (first >= 0) & (first < n_nodes) & (bs >= 0)
    first = tl.where(ok, first, 0)
    safe = tl.where(ok, slot, 0)
    kh = k_cache + layer * s_kl + safe * s_ks + h * s_kh
    vh = v_cache + layer * s_vl + safe * s_vs + h * s_vh
    d = tl.arange(0, BD)
    for depth in range(DEPTH):  # in order of depth: no move reads a position an earlier one wrote
        row = tl.load(path_table + first * s_pn + depth).to(tl.int64)
        src = bs + row
        dst = bs + depth
        move = ok & (row >= 0) & (row != depth) & (src < max_len) & (dst < max_len)
        src = tl.where(move, src, 0)
        dst = tl.where(move, dst, 0)
        m = d < tl.where(move, D, 0)  # nothing read or written unless the move is real
        tl.store(kh + dst * s_kp + d, tl.load(kh + src * s_kp + d, mask=m, other=0.0), mask=m)
        tl.store(vh + dst * s_vp + d, tl.load(vh + src * s_vp + d, mask=m, other=0.0), mask=m)


def kv_compact(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, base: torch.Tensor,
               accepted: torch.Tensor, cu_seqlens: torch.Tensor, path_table: torch.Tensor) -> None:
    """k_cache, v_cache [L, S, H, max_len, D] (every attention layer's, last dimension
    contiguous); per request b of B: slots[b], base[b] (its committed length), accepted[b]
    (the accepted node's local index, -1 for none: nothing moves), cu_seqlens [B + 1] (its
    nodes' offsets in the packed forest) and path_table [N, depth] (the local index of each
    node's ancestor at each depth, -1 past its own). Moves key and value of the ancestor at
    depth d from base + its local index to base + d, in place."""
    check_tensor("k_cache", k_cache, 5)
    check_tensor("v_cache", v_cache, 5, (k_cache.dtype,), k_cache.device)
    if v_cache.shape != k_cache.shape:
        raise InputError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}")
    check_last_contiguous("k_cache", k_cache)
    check_last_contiguous("v_cache", v_cache)
    dev = k_cache.device
    n_layers, n_slots, heads, max_len, d = k_cache.shape
    check_tensor("slots", slots, 1, None, dev)
    bsz = slots.shape[0]
    slots = check_index_vector("slots", slots, bsz, dev)
    base = check_index_vector("base", base, bsz, dev)
    accepted = check_index_vector("accepted", accepted, bsz, dev)
    cu_seqlens = check_index_vector("cu_seqlens", cu_seqlens, bsz + 1, dev)
    check_tensor("path_table", path_table, 2, (torch.int32, torch.int64), dev)
    if path_table.stride(1) != 1 and path_table.shape[1] > 1:
        raise InputError("path_table: the depth dimension must be contiguous")
    if bsz == 0 or n_layers == 0 or heads == 0 or path_table.shape[0] == 0 or path_table.shape[1] == 0:
        return
    _kv_compact_kernel[(n_layers, bsz * heads)](
        k_cache, v_cache, slots, base, accepted, cu_seqlens, path_table, n_slots, path_table.shape[0], max_len,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3), path_table.stride(0),
        H=heads, D=d, BD=triton.next_power_of_2(d), DEPTH=path_table.shape[1], num_warps=1)
