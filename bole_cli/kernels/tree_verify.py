"""Closed-form tree verify through one GDN layer (docs/design.md §2, Theorem 1).

Trees of at most 64 nodes go to the one-tile kernel (tree_verify_tile.py), larger trees (up
to 256 nodes) to the blocked kernel (tree_verify_blocked.py). Past one tile, chains of more
than CHAIN_KERNEL_DEPTH nodes take the chain kernels (tree_verify_chain.py) and the blocked
kernel, launched after them in its REMAINDER mode, skips exactly those; shallow trees of a
known depth take the level kernel (tree_verify_levels.py) instead, by the rule (configs.py).

Each kernel file holds its kernel and its launcher; this module checks the inputs, and
`verify_route` chooses the kernels past one tile (the launch and `verify_scratch_bytes`
both ask it). The kernels share their leading arguments as one VerifyArgs (types.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import triton

from bole_cli.errors import InputError
from bole_cli.kernels._env import interpreting
from bole_cli.kernels.configs import chain_launch_config, launch_config, levels_launch_config
from bole_cli.kernels.tree_verify_blocked import blocked_tp, launch_blocked
from bole_cli.kernels.tree_verify_chain import chain_scratch_shape, launch_chain
from bole_cli.kernels.tree_verify_levels import launch_levels, levels_scratch, levels_width
from bole_cli.kernels.tree_verify_parts import split_workspaces
from bole_cli.kernels.tree_verify_tile import launch_tile
from bole_cli.kernels.types import VerifyResult, verify_args
from bole_cli.kernels.verify_path import is_tile_launch
from bole_cli.limits import CHAIN_KERNEL_DEPTH
from bole_cli.kernels.validate import (
    ACTIVATION_DTYPES,
    STATE_DTYPES,
    check_config,
    check_flag,
    check_forest,
    check_forest_vectors,
    check_last_contiguous,
    check_max_depth,
    check_max_nodes,
    check_nonempty,
    check_out,
    check_pool_slots,
    check_scale,
    check_shape,
    check_tensor,
    contiguous_vector,
)


def tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    check_trees: bool = True,
    max_nodes: Optional[int] = None,
    max_depth: Optional[int] = None,
    config: Optional[dict] = None,
    out: Optional[VerifyResult] = None,
    factors: bool = True,
) -> VerifyResult:
    """Verify a packed forest of draft trees through one GDN layer in closed form.

    Shapes (docs/design.md §3): q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV]; state
    [S, HV, V, K] float32 or bfloat16 (read only); state_indices [B]; parents [N] local,
    -1 for a root; cu_seqlens [B+1]. Returns VerifyResult(o [N, HV, V] in v's dtype,
    u [N, HV, V] float32, log_p [N, HV] float32). `out` reuses preallocated outputs.

    max_nodes: the largest tree in the batch (a promise, checked when check_trees). Trees of
    at most 64 nodes take the one-tile kernel; without the bound and without check_trees
    (which reads the sizes on the host) the big-tree kernels, exact for any size, are used.
    max_depth: the most strict ancestors of any node (a promise, checked when check_trees).
    Past one tile, chains of more than CHAIN_KERNEL_DEPTH nodes (as many strict ancestors or
    more) take the chain kernels (tree_verify_chain.py) and other trees the blocked one; a
    promise below CHAIN_KERNEL_DEPTH (or the host check) saves the chain kernels' launches
    and, by the rule (small batches), takes the level kernel (tree_verify_levels.py). Off
    the level kernel a request neither kernel takes (a broken promise) is computed by the
    blocked kernel; on it, a request deeper than the promise gets NaN rows.

    factors=False: the one-tile kernel writes o alone, u and log_p left as they were (the
    replay commit, the served one, reads neither; their stores and u's product were 14-27%
    of the verify at batch 16-64 on an H100: experiments/NOTES.md "Measured on an H100 at
    the end of the fifth session"); past one tile they are written as before.

    state_indices outside [0, S): an InputError with check_trees; without it (CUDA graphs,
    no host read) that request's o, u and log_p are NaN and the pool is never read there.
    1-D arguments may be strided views (they are copied contiguous); bad input raises one
    InputError naming the argument (docs/design.md §3).
    """
    return _verify(q, k, v, g, beta, None, None, state, state_indices, parents, cu_seqlens, False,
                   scale=scale, use_qk_l2norm=use_qk_l2norm, check_trees=check_trees,
                   max_nodes=max_nodes, max_depth=max_depth, config=config, out=out, factors=factors)


def tree_verify_gated(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    **kwargs,
) -> VerifyResult:
    """tree_verify with the gates fused in: a, b [N, HV] raw (g = -exp(A_log) softplus(a +
    dt_bias), beta = sigmoid(b)), as SGLang's target_verify receives them. Saves a launch
    and a round trip of g and beta through memory."""
    return _verify(q, k, v, a, b, A_log, dt_bias, state, state_indices, parents, cu_seqlens, True, **kwargs)


def _verify(q, k, v, g, beta, A_log, dt_bias, state, state_indices, parents, cu_seqlens, gated, *,
            scale=None, use_qk_l2norm=True, check_trees=True, max_nodes=None, max_depth=None,
            config=None, out=None, factors=True) -> VerifyResult:
    gname, bname = ("a", "b") if gated else ("g", "beta")
    check_tensor("q", q, 3, ACTIVATION_DTYPES)
    dev = q.device
    n, h, kdim = q.shape
    check_nonempty("q", q, {1: "H (key heads)", 2: "K (key dim)"})
    check_tensor("k", k, 3, ACTIVATION_DTYPES, dev)
    check_shape("k", k, (n, h, kdim))
    check_tensor("v", v, 3, ACTIVATION_DTYPES, dev)
    if v.shape[0] != n:
        raise InputError(f"v: expected {n} nodes like q, got shape {tuple(v.shape)}")
    check_nonempty("v", v, {1: "HV (value heads)", 2: "V (value dim)"})
    hv, vdim = v.shape[1], v.shape[2]
    if hv % h:
        raise InputError(f"v: {hv} value heads is not a multiple of q/k's {h} key heads")
    for name, t in ((gname, g), (bname, beta)):
        check_tensor(name, t, 2, ACTIVATION_DTYPES, dev)
        check_shape(name, t, (n, hv))
    if gated:
        A_log = contiguous_vector(check_tensor("A_log", A_log, 1, ACTIVATION_DTYPES, dev))
        dt_bias = contiguous_vector(check_tensor("dt_bias", dt_bias, 1, ACTIVATION_DTYPES, dev))
        check_shape("A_log", A_log, (hv,))
        check_shape("dt_bias", dt_bias, (hv,))
    check_tensor("state", state, 4, STATE_DTYPES, dev)
    if tuple(state.shape[1:]) != (hv, vdim, kdim):
        raise InputError(f"state: expected [S, {hv}, {vdim}, {kdim}] (slots, HV, V, K), got {tuple(state.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("state", state)):
        check_last_contiguous(name, t)
    bsz, state_indices, parents, cu_seqlens = check_forest_vectors(state_indices, parents, cu_seqlens, n, dev)
    scale = check_scale(scale, kdim)
    check_flag("use_qk_l2norm", use_qk_l2norm)
    check_flag("check_trees", check_trees)
    check_flag("factors", factors)
    if max_nodes is not None:
        check_max_nodes(max_nodes)
    check_max_depth(max_depth)
    if out is not None:
        out = check_out(out, n, hv, vdim, dev)
    check_config("tree_verify", config)
    if check_trees:
        largest = check_forest(parents, cu_seqlens, n)
        if max_nodes is not None and largest > max_nodes:
            raise InputError(f"max_nodes: {max_nodes} promised, but a request has {largest} nodes")
        max_nodes = largest
        # depths only where they matter: a depth promise to check, or the big-tree launch
        deepest, kinds = (_forest_depths(parents, cu_seqlens)
                          if max_depth is not None or not is_tile_launch({"T": largest}) else (0, None))
        if max_depth is not None and deepest > max_depth:
            raise InputError(f"max_depth: {max_depth} promised, but a node has {deepest} strict ancestors")
        check_pool_slots(state_indices, state.shape[0], check_trees)

    o, u, log_p = VerifyResult.like(v) if out is None else out
    if n == 0 or bsz == 0:
        return VerifyResult(o, u, log_p)

    shape = {"K": kdim, "V": vdim, "HV": hv, "B": bsz, "N": n, "T": max_nodes or 0}
    tile = is_tile_launch(shape)
    if not tile:
        shape["T"] = 0  # the blocked kernel: its rule and tuned buckets go by the mean tree
    cfg = launch_config("tree_verify", shape, config)
    # tf32 dots are well inside bf16/fp16 activations' noise; float32 activations get tf32x3
    # (three tf32 products, about float32's accuracy). "split" (u exact, the readout at tf32)
    # is the one-tile kernel's for 16-bit activations; tf32x3 everywhere else.
    precision = cfg["precision"] or ("tf32x3" if q.dtype == torch.float32 else "tf32")
    split = precision == "split" and tile and q.dtype == k.dtype and q.dtype != torch.float32
    if precision == "split" and not split:
        precision = "tf32x3"
    vp = triton.next_power_of_2(vdim)
    kp = triton.next_power_of_2(kdim)
    bv = min(cfg["BV"], vp)
    bk = min(cfg["BK"], kp)
    args = verify_args(q, k, v, g, beta, A_log if gated else g, dt_bias if gated else g, state, state_indices,
                       parents, cu_seqlens, o, u, log_p, scale)
    # 16-bit Gram operands: not under the interpreter, whose 16-bit dots are not exact
    # (and 16-bit dots need a 16-wide inner dimension)
    gram16 = bool(cfg["GRAM16"]) and q.dtype == k.dtype and q.dtype in (torch.bfloat16, torch.float16) \
        and bk >= 16 and not interpreting()
    shape_consts = dict(GROUP=hv // h, K=kdim, V=vdim, KP=kp, USE_L2NORM=use_qk_l2norm, PRECISION=precision,
                        GATED=gated)
    common = dict(shape_consts, BV=bv, BK=bk, GRAM16=gram16, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if tile:
        launch_tile(args, bsz, max_nodes, cfg["VSPLIT"],
                    dict(common, PRECISION="tf32" if split else precision,
                         STATE_PRECISION="tf32x3" if split else precision, SPLIT_STATE=split,
                         STORE_FACTORS=factors))
        return VerifyResult(o, u, log_p)
    tp = blocked_tp(max_nodes)  # the whole tree's rows sit in registers (the ancestor walk)
    # Chains of more than CHAIN_KERNEL_DEPTH nodes take the chain kernel, everything else
    # the blocked one after it; the host check or a max_depth promise can rule the chains out.
    if check_trees:
        long_chain, other = kinds
        depth_bound = deepest
    else:
        long_chain = other = max_depth is None or max_depth >= CHAIN_KERNEL_DEPTH
        depth_bound = max_depth
    route = verify_route(cfg, long_chain=long_chain, other=other, depth_bound=depth_bound)
    if route.chain:  # its own rule; an explicit config= applies to it too
        chain_cfg = _overridden(chain_launch_config(bsz * hv), config)
        chain_cfg.update(BV=min(chain_cfg["BV"], vp), BC=min(chain_cfg["BC"], 64))
        launch_chain(args, bsz, chain_cfg, dict(shape_consts, KP=max(16, kp), TP=tp, DS=CHAIN_KERNEL_DEPTH))
    if route.levels:  # shallow trees level by level, by its own rule; config= applies to it too
        level_cfg = _overridden(dict(levels_launch_config(tp), RB=cfg["RB"]), config)
        launch_levels(args, bsz, level_cfg, levels_width(depth_bound), dict(shape_consts, TP=tp))
    if route.blocked:
        launch_blocked(args, bsz, dict(common, BC=min(cfg["BC"], 64), NW=tp // 64, TP=tp, DS=CHAIN_KERNEL_DEPTH,
                                       REMAINDER=route.chain, SPLIT=route.split))
    return VerifyResult(o, u, log_p)


class VerifyRoute(NamedTuple):
    """Which kernels a launch past one tile runs, in this order (docs/design.md §3)."""

    chain: bool  # the chain kernels, for requests that are long chains
    levels: bool  # the level kernel, for every request (a depth below CHAIN_KERNEL_DEPTH)
    blocked: bool  # the blocked kernel, for every request the chain kernels left
    split: bool  # the blocked kernel's parts in a wide launch first (SPLIT)


def verify_route(cfg: dict, *, long_chain: bool, other: bool, depth_bound: Optional[int]) -> VerifyRoute:
    """The one choice of kernels past one tile, from the launch config and what is known of
    the trees: whether long chains (`long_chain`) and other requests (`other`) may be
    present and the most strict ancestors of any node (`depth_bound`, None: unknown). The
    launch and `verify_scratch_bytes` (the plug-in's memory budget) both ask this, so they
    cannot disagree."""
    split = bool(cfg["SPLIT"])
    if cfg["CHAIN"] and long_chain:
        return VerifyRoute(True, False, other, split)
    if cfg["LEVELS"] and depth_bound is not None and depth_bound < CHAIN_KERNEL_DEPTH:
        return VerifyRoute(False, True, False, False)
    return VerifyRoute(False, False, True, split)


def _overridden(rule: dict, config: Optional[dict]) -> dict:
    """A kernel's own launch rule with the keys an explicit config= names taken from it."""
    return {key: config[key] if config and key in config else value for key, value in rule.items()}


def verify_scratch_bytes(n: int, bsz: int, h: int, hv: int, kdim: int, vdim: int, max_nodes: Optional[int],
                         max_depth: Optional[int] = None) -> int:
    """Scratch bytes one tree_verify launch allocates beyond its outputs, for memory budgets
    (`bole bench kernels`' transient bytes, the SGLang plug-in's reserve): the level
    kernel's when the rule takes it (a depth promise below CHAIN_KERNEL_DEPTH), else SPLIT's
    workspaces, and the chain kernels' factors when long chains may be present (max_depth
    None or at least CHAIN_KERNEL_DEPTH); 0 for the one-tile kernel or the whole blocked one
    alone. The launch rules, not config=."""
    shape = {"K": kdim, "V": vdim, "HV": hv, "B": bsz, "N": n, "T": max_nodes or 0}
    if is_tile_launch(shape):
        return 0
    cfg = launch_config("tree_verify", dict(shape, T=0))
    tp = blocked_tp(max_nodes)
    long_chain = max_depth is None or max_depth >= CHAIN_KERNEL_DEPTH  # as a launch without check_trees
    route = verify_route(cfg, long_chain=long_chain, other=long_chain, depth_bound=max_depth)
    if route.levels:
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in levels_scratch(n, h, levels_width(max_depth)))
    total = 0
    if route.blocked and route.split:
        total += sum(math.prod(shape) * dtype.itemsize for shape, dtype in split_workspaces(n, bsz, h, hv, vdim, tp))
    if route.chain:
        total += math.prod(chain_scratch_shape(bsz, hv, tp, min(chain_launch_config(bsz * hv)["BC"], 64))) * 4
    return total


def _forest_depths(parents: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[int, tuple[bool, bool]]:
    """Host read (check_trees only): (the most strict ancestors of any node, (whether some
    request is a chain of more than CHAIN_KERNEL_DEPTH nodes: the chain kernel, whether some other
    request is not: the blocked kernel)). Depths by pointer jumping, log2(depth) steps."""
    par = parents.detach().to("cpu", torch.int64)
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if par.numel() == 0:
        return 0, (False, False)
    sizes = cu[1:] - cu[:-1]
    first = torch.repeat_interleave(cu[:-1], sizes)
    local = torch.arange(par.numel()) - first
    ptr = torch.where(par >= 0, par + first, torch.full_like(par, -1))
    dist = (ptr >= 0).to(torch.int64)  # levels from each node up to where ptr points
    while bool((ptr >= 0).any()):
        live = ptr >= 0
        safe = ptr.clamp_min(0)
        dist = dist + torch.where(live, dist[safe], 0)
        ptr = torch.where(live, ptr[safe], ptr)
    req = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    counts = torch.zeros(sizes.numel(), dtype=torch.int64)
    not_chain = counts.index_add(0, req, (par != local - 1).to(torch.int64)) > 0
    deep = counts.index_add(0, req, (dist >= CHAIN_KERNEL_DEPTH).to(torch.int64)) > 0
    long_chain = ~not_chain & deep & (sizes > 0)
    return int(dist.max()), (bool(long_chain.any()), bool((~long_chain & (sizes > 0)).any()))
