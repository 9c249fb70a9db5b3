"""Tree-parallel depthwise causal conv (width W, SiLU) and its accepted-path commit.

Each node's window is itself and its W-1 nearest ancestors; where the chain reaches the
root, it continues into the committed conv window `conv_state` (the last W-1 inputs of the
request, oldest first). Every node is computed independently, so the whole forest runs in
parallel: one program per (request, channel block), looping over the request's nodes.

conv_state is addressed by strides in the logical layout [S, D, W-1], so SGLang's pool in
either [S, D, W-1] or [S, W-1, D] storage is used in place (pass `.transpose(1, 2)` of the
latter).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.jit_math import accepted_node, forest_span
from bole_cli.kernels.validate import (
    ACTIVATION_DTYPES,
    check_accepted,
    check_commit_slots,
    check_config,
    check_distinct_elements,
    check_flag,
    check_forest,
    check_forest_vectors,
    check_nonempty,
    check_pool_slots,
    check_shape,
    check_tensor,
    contiguous_vector,
)


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def _tree_conv_kernel(
    x, conv_state, weight, bias, state_idx, parents, cu, y,
    dim, n_slots, n_rows, s_xn, s_cn, s_cd, s_cw, s_wd, s_yn,
    W: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
):
    b = tl.program_id(0)
    offs_d = tl.program_id(1) * BD + tl.arange(0, BD)
    dmask = offs_d < dim
    start, n_nodes = forest_span(cu, b, n_rows)
    n_nodes = n_nodes.to(tl.int32)
    slot = tl.load(state_idx + b).to(tl.int64)
    # A slot outside the pool (no host check): the window is never read, the outputs are NaN.
    in_pool = (slot >= 0) & (slot < n_slots)
    poison = tl.where(in_pool, 0.0, float("nan"))
    n_hist = tl.where(in_pool, n_nodes, 0)  # rows that may read the window
    hist = conv_state + slot * s_cn + offs_d[None, :] * s_cd
    for nb in range(0, tl.cdiv(n_nodes, BN)):
        rows = nb * BN + tl.arange(0, BN)
        rmask = rows < n_nodes
        hmask = rows < n_hist
        cur = tl.where(rmask, rows, -1)
        chain = tl.zeros([BN], dtype=tl.int32)  # nodes of the chain seen so far
        acc = tl.zeros([BN, BD], dtype=tl.float32) + poison
        if HAS_BIAS:
            acc += tl.load(bias + offs_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        for s in tl.static_range(W):  # s steps back from the node; tap W-1-s
            on_tree = cur >= 0
            xv = tl.load(x + (start + cur)[:, None] * s_xn + offs_d[None, :],
                         mask=on_tree[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            col = (W - 2) - (s - chain)  # history column once the chain left the tree
            hv = tl.load(hist + col[:, None] * s_cw,
                         mask=(hmask & ~on_tree)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            wv = tl.load(weight + offs_d * s_wd + (W - 1 - s), mask=dmask, other=0.0).to(tl.float32)
            acc += tl.where(on_tree[:, None], xv, hv) * wv[None, :]
            chain += on_tree.to(tl.int32)
            nxt = tl.load(parents + start + cur, mask=on_tree, other=-1).to(tl.int32)
            cur = tl.where(on_tree & (nxt < cur), nxt, -1)
        if ACTIVATION:
            acc = acc * tl.sigmoid(acc)
        tl.store(y + (start + rows)[:, None] * s_yn + offs_d[None, :], acc.to(y.dtype.element_ty),
                 mask=rmask[:, None] & dmask[None, :])


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def _tree_conv_commit_kernel(
    conv_state, x, state_idx, parents, cu, accepted,
    dim, n_slots, n_rows, s_xn, s_cn, s_cd, s_cw,
    W: tl.constexpr, WP: tl.constexpr, BD: tl.constexpr,
):
    b = tl.program_id(0)
    a = accepted_node(accepted, b, n_rows)
    slot = tl.load(state_idx + b).to(tl.int64)
    start, n_nodes = forest_span(cu, b, n_rows)
    # a slot outside the pool or a node outside the tree (no host check): slot untouched
    if (a >= 0) & (a < n_nodes) & (slot >= 0) & (slot < n_slots):
        offs_d = tl.program_id(1) * BD + tl.arange(0, BD)
        dmask = offs_d < dim
        cols = tl.arange(0, WP)
        ptrs = conv_state + slot * s_cn + offs_d[:, None] * s_cd + cols[None, :] * s_cw
        tmask = dmask[:, None] & (cols < W - 1)[None, :]
        old = tl.load(ptrs, mask=tmask, other=0.0)  # read everything before writing in place
        new = old
        cur = tl.zeros([BD], dtype=tl.int32) + a  # the path node, broadcast over channels
        chain = tl.zeros([BD], dtype=tl.int32)
        for e in tl.static_range(W - 1):  # e steps back from the accepted node -> column W-2-e
            on_tree = cur >= 0
            xv = tl.load(x + (start + cur) * s_xn + offs_d, mask=dmask & on_tree, other=0.0)
            src = (W - 2) - e + chain
            hv = tl.sum(tl.where(cols[None, :] == src[:, None], old, 0.0), axis=1)
            val = tl.where(on_tree, xv.to(old.dtype), hv.to(old.dtype))
            new = tl.where(cols[None, :] == (W - 2 - e), val[:, None], new)
            chain += on_tree.to(tl.int32)
            nxt = tl.load(parents + start + cur, mask=on_tree, other=-1).to(tl.int32)
            cur = tl.where(on_tree & (nxt < cur), nxt, -1)
        tl.store(ptrs, new, mask=tmask)


def _check_channels(name: str, t: torch.Tensor) -> None:
    """The kernels read a row's channels as consecutive elements (rows may be strided)."""
    if t.numel() and t.stride(1) != 1:
        raise InputError(f"{name}: the channel dimension must be contiguous")


def _check_conv_common(x, conv_state, state_indices, parents, cu_seqlens, check_trees, check_slots=True):
    """The checks tree_conv and tree_conv_commit share; returns the index vectors (contiguous).
    check_slots=False: the commit checks only the slots it writes (accepted >= 0)."""
    check_tensor("x", x, 2, ACTIVATION_DTYPES)
    dev = x.device
    n, dim = x.shape
    check_nonempty("x", x, {1: "D (channels)"})
    check_tensor("conv_state", conv_state, 3, ACTIVATION_DTYPES, dev)
    if conv_state.shape[1] != dim:
        raise InputError(f"conv_state: expected [S, {dim}, W-1] (logical layout), got {tuple(conv_state.shape)}")
    bsz, state_indices, parents, cu_seqlens = check_forest_vectors(state_indices, parents, cu_seqlens, n, dev)
    _check_channels("x", x)
    check_flag("check_trees", check_trees)
    if check_trees:
        check_forest(parents, cu_seqlens, n)
        if check_slots:
            check_pool_slots(state_indices, conv_state.shape[0], check_trees)
    return n, dim, bsz, state_indices, parents, cu_seqlens


def tree_conv(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    state_indices: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    activation: bool = True,
    check_trees: bool = True,
    config: Optional[dict] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """y [N, D] = SiLU(bias + sum_w weight[:, w] * window_w) along each node's ancestor chain.

    x [N, D] (rows may be strided, channels contiguous); conv_state [S, D, W-1] logical (read
    only); weight [D, W]; bias [D] or None; out: y's buffer [N, D] in x's dtype (channels
    contiguous), else a new one. A request whose slot lies outside [0, S): InputError with
    check_trees, else NaN rows and its window is never read (docs/design.md §3).
    """
    n, dim, bsz, state_indices, parents, cu_seqlens = _check_conv_common(
        x, conv_state, state_indices, parents, cu_seqlens, check_trees)
    check_tensor("weight", weight, 2, ACTIVATION_DTYPES, x.device)
    check_nonempty("weight", weight, {1: "W (conv width)"})
    width = weight.shape[1]
    check_shape("weight", weight, (dim, width))
    weight = weight.contiguous()  # the kernel reads a row's taps as consecutive elements
    check_shape("conv_state", conv_state, (conv_state.shape[0], dim, width - 1))
    if bias is not None:
        bias = contiguous_vector(check_tensor("bias", bias, 1, ACTIVATION_DTYPES, x.device))
        check_shape("bias", bias, (dim,))
    check_flag("activation", activation)
    check_config("tree_conv", config)
    if out is None:
        y = torch.empty(n, dim, dtype=x.dtype, device=x.device)
    else:
        y = check_tensor("out", out, 2, (x.dtype,), x.device)
        check_shape("out", out, (n, dim))
        _check_channels("out", out)
        check_distinct_elements("out", out)
        if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise InputError("out: shares memory with x (a node's conv reads its ancestors' inputs)")
    if n == 0 or bsz == 0:
        return y
    cfg = launch_config("tree_conv", {"D": dim, "W": width, "B": bsz, "N": n}, config)
    grid = (bsz, triton.cdiv(dim, cfg["BD"]))
    _tree_conv_kernel[grid](
        x, conv_state, weight, bias if bias is not None else weight, state_indices, parents, cu_seqlens, y,
        dim, conv_state.shape[0], n, x.stride(0), conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        weight.stride(0), y.stride(0),
        W=width, BN=cfg["BN"], BD=cfg["BD"], HAS_BIAS=bias is not None, ACTIVATION=activation,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y


def tree_conv_commit(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    state_indices: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    accepted: torch.Tensor,
    *,
    check_trees: bool = True,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Set each request's conv window to the last W-1 inputs on the path to its accepted
    node (in place; accepted = -1 leaves the slot untouched). Returns conv_state.

    With check_trees a slot outside [0, S) or two committing requests sharing a slot are
    InputErrors naming state_indices; without it a request whose slot lies outside the pool
    (or whose accepted node lies outside its tree) is skipped, and shared commit slots are
    undefined (docs/design.md §3)."""
    n, dim, bsz, state_indices, parents, cu_seqlens = _check_conv_common(
        x, conv_state, state_indices, parents, cu_seqlens, check_trees, check_slots=False)
    accepted = check_accepted(accepted, cu_seqlens, x.device, check_trees)
    if check_trees:
        check_commit_slots(state_indices, conv_state.shape[0], accepted >= 0)
    check_config("tree_conv", config)
    if n == 0 or bsz == 0:
        return conv_state
    width = conv_state.shape[2] + 1
    cfg = launch_config("tree_conv", {"D": dim, "W": width, "B": bsz, "N": n}, config)
    grid = (bsz, triton.cdiv(dim, cfg["BD"]))
    _tree_conv_commit_kernel[grid](
        conv_state, x, state_indices, parents, cu_seqlens, accepted,
        dim, conv_state.shape[0], n, x.stride(0), conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        W=width, WP=triton.next_power_of_2(max(width - 1, 1)), BD=cfg["BD"],
        num_warps=cfg["num_warps"],
    )
    return conv_state
