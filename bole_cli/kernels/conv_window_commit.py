"""The conv-window commit of the SGLang plug-in's factor store: every layer's committed conv
window after a verify, in one launch.

SGLang's tree or chain conv overwrites the committed window during verify, so the store
keeps the verify's conv inputs x and the window from before it (prev); after acceptance the
window of each request is the last W-1 inputs on the root path of its accepted node, and,
where that path is shorter than W-1, the newest columns of prev (docs/design.md §6). Unlike
`tree_conv.tree_conv_commit` (one layer, the window read from the slot being written) it
covers all layers and reads the old window from the store's own copy. Reference:
`reference.conv_window_commit_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.errors import BoleError
from bole_cli.kernels.jit_math import accepted_node, forest_span
from bole_cli.kernels.validate import contiguous_vector

BLOCK_CHANNELS = 128


@triton.jit
def _conv_window_commit_kernel(
    conv, x, prev, dst, parents, cu, accepted,
    n_req, dim, n_slots, n_rows,
    s_cl, s_cs, s_cd, s_cw, s_xl, s_xn, s_pl, s_pb, s_pd, s_pw,
    W1: tl.constexpr, WP: tl.constexpr, BD: tl.constexpr,
):
    """conv[l, dst[b]] = the last W-1 conv inputs on the root path of accepted[b]; where
    the path is shorter, the newest columns of the pre-verify window prev[l, b]. A slot
    outside [0, n_slots) or an accepted node outside the request (its span clamped to the
    n_rows tokens) leaves the slot alone."""
    pid = tl.program_id(0)
    layer = (pid // n_req).to(tl.int64)
    b = pid % n_req
    a = accepted_node(accepted, b, n_rows)
    slot = tl.load(dst + b).to(tl.int64)
    start, n_nodes = forest_span(cu, b, n_rows)
    if (a >= 0) & (a < n_nodes) & (slot >= 0) & (slot < n_slots):
        offs_d = tl.program_id(1) * BD + tl.arange(0, BD)
        dmask = offs_d < dim
        cols = tl.arange(0, WP)
        x_base = x + layer * s_xl + offs_d
        p_base = prev + layer * s_pl + b * s_pb + offs_d * s_pd
        new = tl.zeros([BD, WP], dtype=tl.float32)
        cur = tl.zeros([BD], dtype=tl.int32) + a  # the path node, broadcast over channels
        chain = tl.zeros([BD], dtype=tl.int32)  # tree nodes taken so far
        for e in tl.static_range(W1):  # e steps back from the accepted node -> column W1-1-e
            on = cur >= 0
            node = tl.maximum(cur, 0)
            xv = tl.load(x_base + (start + node) * s_xn, mask=dmask & on, other=0.0).to(tl.float32)
            col = (W1 - 1) - e + chain  # the window column once the path has left the tree
            pv = tl.load(p_base + col * s_pw, mask=dmask & (~on), other=0.0).to(tl.float32)
            val = tl.where(on, xv, pv)
            new = tl.where(cols[None, :] == (W1 - 1 - e), val[:, None], new)
            nxt = tl.load(parents + start + node, mask=on, other=-1).to(tl.int32)
            chain += on.to(tl.int32)
            cur = tl.where(on & (nxt < cur), nxt, -1)
        ptrs = conv + layer * s_cl + slot * s_cs + offs_d[:, None] * s_cd + cols[None, :] * s_cw
        tl.store(ptrs, new.to(conv.dtype.element_ty), mask=dmask[:, None] & (cols < W1)[None, :])


def conv_window_commit(conv: torch.Tensor, x: torch.Tensor, prev: torch.Tensor, dst: torch.Tensor,
                       parents: torch.Tensor, cu: torch.Tensor, accepted: torch.Tensor) -> None:
    """All layers in one launch. conv [L, S, dim, W-1] (any strides), x [L, T, dim]
    (channel-contiguous), prev [L, B', dim, W-1] (B' >= B), dst/accepted [B], cu [B+1]. A
    request whose slot lies outside [0, S) or whose accepted node lies outside its tree
    commits nothing."""
    n_layers, _, dim, w1 = conv.shape
    n_req = accepted.shape[0]
    if n_req == 0 or n_layers == 0 or dim == 0:
        return
    if x.stride(-1) != 1:
        raise BoleError("conv_window_commit: x must be channel-contiguous")
    if prev.shape[1] < n_req:
        raise BoleError(f"conv_window_commit: prev holds {prev.shape[1]} windows for {n_req} requests")
    dst, parents, cu, accepted = (contiguous_vector(t) for t in (dst, parents, cu, accepted))  # raw memory
    bd = BLOCK_CHANNELS
    grid = (n_layers * n_req, triton.cdiv(dim, bd))
    _conv_window_commit_kernel[grid](
        conv, x, prev, dst, parents, cu, accepted, n_req, dim, conv.shape[1], x.shape[1],
        *conv.stride(), x.stride(0), x.stride(1), *prev.stride(),
        W1=w1, WP=triton.next_power_of_2(max(w1, 1)), BD=bd, num_warps=4,
    )
