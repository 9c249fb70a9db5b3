"""A tree step's metadata in one launch: depths, positions, rotary rows, ancestor tables, the
snapshot and SGLang parent rows and the tree attention's mask, from the step's parents,
tokens and committed lengths.

The runtime refills these arrays on the device every step, inside the captured graph
(docs/design.md §3 tree arrays, §8 the serving step). Written as fixed-shape torch ops that
refill is some ninety small launches; here one program takes a block of one request's node
rows and walks each row's root path (a few dependent loads of the parents, which stay in
L1). The torch refill (`bole_cli.runtime.tree_metadata.refill_tree`) is its reference and
keeps the dense [cache | tree] mask, which this kernel does not write.

Whatever the parents say, the kernel reads and writes only inside its arguments: a parent
outside 0..i-1 ends the walk as a root would, and a walk stops after max_depth nodes (the
bucket's promise; a deeper forest is cut, as the torch refill cuts it).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import check_shape, check_tensor, contiguous_vector

ROWS = 32  # node rows a program (16 for trees of 128 or more): one request's block


@triton.jit
def _tree_metadata_kernel(
    parents_in, tokens_in, base_in, cu, rope_cos, rope_sin,
    tokens, parents, base, kv_used, depths, positions, kv_pos, cos, sin,
    path_table, parent_rows, sglang_parents, layer_parents, tree_bias,
    n_req, n_nodes, n_layers, rope_rows, T, D, s_bias_b, s_bias_r,
    HALF: tl.constexpr, HP: tl.constexpr, TP: tl.constexpr, DP: tl.constexpr, BR: tl.constexpr,
    G: tl.constexpr, HAS_KV_USED: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    b = tl.program_id(0)
    rows = tl.program_id(1) * BR + tl.arange(0, BR)  # local node indices
    start = tl.load(cu + b).to(tl.int64)
    size = tl.load(cu + b + 1).to(tl.int64) - start
    base_b = tl.load(base_in + b).to(tl.int64)
    if tl.program_id(1) == 0:
        tl.store(base + b, base_b)
        if HAS_KV_USED:
            tl.store(kv_used + b, base_b.to(tl.int32))
    # cu_seqlens is trusted no further than the packed rows: a row outside 0..N-1 is no node
    valid = (rows < size) & (rows < T) & (start + rows >= 0) & (start + rows < n_nodes)
    in_t = rows < T
    node = start + rows
    raw = tl.load(parents_in + node, mask=valid, other=-1)
    par = tl.where(valid & (raw >= 0) & (raw < rows), raw.to(tl.int64), -1)  # earlier nodes only: walks end

    # walk 1: the depth (strict ancestors, at most D - 1)
    depth = tl.zeros([BR], dtype=tl.int64)
    cur = par
    for _ in range(D - 1):
        on = cur >= 0
        depth += on.to(tl.int64)
        nxt = tl.load(parents_in + start + cur, mask=on & (start + cur >= 0), other=-1).to(tl.int64)
        cur = tl.where(on & (nxt >= 0) & (nxt < cur), nxt, -1)

    # walk 2: the ancestor table (-1 past the depth) and the ancestor bits of each row
    cols_d = tl.arange(0, DP)
    row_ptr = path_table + node[:, None] * D + cols_d[None, :]
    tl.store(row_ptr, tl.full([BR, DP], -1, tl.int64),
             mask=valid[:, None] & (cols_d[None, :] > depth[:, None]) & (cols_d[None, :] < D))
    cols_t = tl.arange(0, TP)
    anc = tl.zeros([BR, TP], dtype=tl.int32)  # anc[i, j]: j on i's root path
    cur = tl.where(valid, rows, -1).to(tl.int64)
    for s in range(D):
        on = cur >= 0
        anc = anc | (cols_t[None, :] == cur[:, None]).to(tl.int32)
        tl.store(path_table + node * D + (depth - s), cur, mask=on & (depth >= s))
        nxt = tl.where(cur == rows, par,
                       tl.load(parents_in + start + cur, mask=on & (start + cur >= 0), other=-1).to(tl.int64))
        cur = tl.where(on & (nxt >= 0) & (nxt < cur), nxt, -1)

    # per node: copies, positions, the rotary rows
    pos = base_b + depth
    tl.store(tokens + node, tl.load(tokens_in + node, mask=valid, other=0).to(tl.int64), mask=valid)
    tl.store(parents + node, raw.to(tl.int32), mask=valid)
    tl.store(depths + node, depth, mask=valid)
    tl.store(positions + node, pos, mask=valid)
    tl.store(kv_pos + node, base_b + rows, mask=valid)
    h = tl.arange(0, HP)
    wmask = valid[:, None] & (h[None, :] < HALF)
    rmask = wmask & (pos[:, None] >= 0) & (pos[:, None] < rope_rows)
    src = pos[:, None] * HALF + h[None, :]
    dst = node[:, None] * HALF + h[None, :]
    tl.store(cos + dst, tl.load(rope_cos + src, mask=rmask, other=0.0), mask=wmask)
    tl.store(sin + dst, tl.load(rope_sin + src, mask=rmask, other=0.0), mask=wmask)
    for layer in range(n_layers):
        tl.store(layer_parents + layer * n_nodes + node, raw.to(tl.int32), mask=valid)

    # per padded row (local index < T, padded rows past the tree): the parent rows and the mask
    tl.store(parent_rows + rows * n_req + b, b * (T + 1) + par + 1, mask=in_t)
    tl.store(sglang_parents + b * T + rows, tl.maximum(par, 0), mask=in_t)
    if HAS_BIAS:
        # a padded row sees its own (zero) key, so it stays finite (and is dropped)
        vis = (anc != 0) | ((~valid)[:, None] & (cols_t[None, :] == rows[:, None]))
        val = tl.where(vis, 0.0, float("-inf")).to(tree_bias.dtype.element_ty)
        bmask = in_t[:, None] & (cols_t[None, :] < T)
        for g in tl.static_range(G):
            ptr = tree_bias + b * s_bias_b + (rows[:, None] * G + g) * s_bias_r + cols_t[None, :]
            tl.store(ptr, val, mask=bmask)


def tree_metadata(parents_in: torch.Tensor, tokens_in: torch.Tensor, base_in: torch.Tensor,
                  cu_seqlens: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, *,
                  max_nodes: int, max_depth: int, tokens: torch.Tensor, parents: torch.Tensor,
                  base: torch.Tensor, depths: torch.Tensor, positions: torch.Tensor, kv_pos: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, path_table: torch.Tensor, parent_rows: torch.Tensor,
                  sglang_parents: torch.Tensor, layer_parents: torch.Tensor,
                  kv_used: Optional[torch.Tensor] = None, tree_bias: Optional[torch.Tensor] = None,
                  group: int = 1) -> None:
    """Write a tree step's metadata in place (the runtime's TreeBatch arrays; see
    bole_cli.runtime.batch.TreeBatch for each one's meaning).

    parents_in [N] local (-1 a root), tokens_in [N], base_in [B] committed lengths: integer
    vectors. cu_seqlens [B+1] int32 (the bucket's request sizes, at most max_nodes each);
    rope_cos, rope_sin [P, rope/2] float32 rows by position (a position past P gets zeros).
    max_depth: the nodes on a root path the bucket holds (path_table's width). tree_bias [B,
    1, max_nodes * group, max_nodes] (rows may be padded; the last dim contiguous), kv_used
    [B] int32: written when given.
    """
    n = parents_in.shape[0]
    bsz = cu_seqlens.shape[0] - 1
    dev = parents_in.device
    ints = (torch.int32, torch.int64)
    for name, t, shape in (("parents_in", parents_in, (n,)), ("tokens_in", tokens_in, (n,)),
                           ("base_in", base_in, (bsz,)), ("cu_seqlens", cu_seqlens, (bsz + 1,))):
        check_tensor(name, t, 1, ints, dev)
        check_shape(name, t, shape)
    # read as raw memory: a strided view is copied (on the device, no sync)
    parents_in, tokens_in, base_in, cu_seqlens = (contiguous_vector(t) for t in (parents_in, tokens_in, base_in,
                                                                                 cu_seqlens))
    if not isinstance(max_nodes, int) or not isinstance(max_depth, int) or max_nodes < 1 or max_depth < 1:
        raise InputError(f"max_nodes, max_depth: positive integers, got {max_nodes!r}, {max_depth!r}")
    half = rope_cos.shape[1] if rope_cos.dim() == 2 else -1
    i64 = (torch.int64,)
    outs = [("tokens", tokens, (n,), i64), ("parents", parents, (n,), (torch.int32,)), ("base", base, (bsz,), i64),
            ("depths", depths, (n,), i64), ("positions", positions, (n,), i64), ("kv_pos", kv_pos, (n,), i64),
            ("rope_cos", rope_cos, (rope_cos.shape[0], half), (torch.float32,)),
            ("rope_sin", rope_sin, tuple(rope_cos.shape), (torch.float32,)),
            ("cos", cos, (n, half), (torch.float32,)), ("sin", sin, (n, half), (torch.float32,)),
            ("path_table", path_table, (n, max_depth), i64),
            ("parent_rows", parent_rows, (max_nodes, bsz), i64),
            ("sglang_parents", sglang_parents, (bsz, max_nodes), i64)]
    if kv_used is not None:
        outs.append(("kv_used", kv_used, (bsz,), (torch.int32,)))
    for name, t, shape, dtypes in outs:
        check_tensor(name, t, len(shape), dtypes, dev)
        check_shape(name, t, shape)
        if not t.is_contiguous():
            raise InputError(f"{name}: must be contiguous")
    check_tensor("layer_parents", layer_parents, 1, (torch.int32,), dev)
    if n and (layer_parents.numel() % n or not layer_parents.is_contiguous()):
        raise InputError(f"layer_parents: a contiguous multiple of {n} entries, got {layer_parents.numel()}")
    if tree_bias is not None:
        check_tensor("tree_bias", tree_bias, 4, None, dev)
        check_shape("tree_bias", tree_bias, (bsz, 1, max_nodes * group, max_nodes))
        if tree_bias.stride(3) != 1:
            raise InputError("tree_bias: the last dimension must be contiguous")
    if bsz == 0:  # an all-empty forest still writes its requests' lengths, rows and mask
        return
    tp = triton.next_power_of_2(max_nodes)
    br = min(ROWS if tp < 128 else ROWS // 2, tp)  # a block's [BR, TP] tiles within the registers
    _tree_metadata_kernel[(bsz, triton.cdiv(max_nodes, br))](
        parents_in, tokens_in, base_in, cu_seqlens, rope_cos, rope_sin,
        tokens, parents, base, kv_used if kv_used is not None else base, depths, positions, kv_pos, cos, sin,
        path_table, parent_rows, sglang_parents, layer_parents,
        tree_bias if tree_bias is not None else cos,
        bsz, n, layer_parents.numel() // n if n else 0, rope_cos.shape[0], max_nodes, max_depth,
        tree_bias.stride(0) if tree_bias is not None else 0, tree_bias.stride(2) if tree_bias is not None else 0,
        HALF=half, HP=triton.next_power_of_2(max(half, 1)), TP=tp, DP=triton.next_power_of_2(max_depth), BR=br,
        G=group, HAS_KV_USED=kv_used is not None, HAS_BIAS=tree_bias is not None, num_warps=4)
