"""A step's tree (or decode) metadata derived on the device, inside the captured graph.

`prepare_tree` / `prepare_decode` (runtime/batch.py) check a step on the host and allocate
its arrays. A serving loop that replays one CUDA graph per bucket (`signature()`) need not
rebuild them on the host every step: `refill_tree` / `refill_decode` recompute every
step-dependent array IN PLACE from three small device inputs (parents, tokens, committed
lengths) with fixed-shape torch ops only (no host read, no data-dependent shape), so the
refill is captured in the same graph as the forward (docs/design.md §3 for the tree
arrays, §8 for the timed serving step: its host part is what a production engine does not
pay). `TreeInputs` is the host side: one O(N) check of what the static layout cannot
express, one pinned buffer, one H2D copy.

What a bucket bakes in, and the caller must keep (TreeInputs.load checks it; refill_*
cannot, it never reads the device):
- the request sizes (cu_seqlens), the slots, the attention mode and kv_limit;
- every node's root path at most tb.max_depth nodes: the path table has that many
  columns and depth is found in max_depth - 1 parent-chasing steps, so a deeper forest
  would be cut silently (the tree kernels are also promised max_depth);
- base[b] + size[b] <= kv_limit (the keys the attention reads; scratch KV lies past base);
- split mode (tb.split_base set): every base equals split_base, a Python int the cache
  part reads without a mask;
- varlen mode (tb.kv_used set): every base >= 1 (flash's lse over no key is +inf);
- a decode bucket without mask nor kv_used: every base equals kv_limit - 1.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import torch

from bole_cli.errors import InputError

# batch.py's TreeBatch, DecodeBatch and Rope; not imported: batch.py imports this module
_TreeBatch = _DecodeBatch = _Rope = Any


def _fold(vis: torch.Tensor, group: int) -> torch.Tensor:
    """[B, T, keys] -> [B, 1, T*G, keys]: the query rows of the GQA fold (one KV head's
    G query heads share a mask row)."""
    bsz, t, keys = vis.shape
    return vis[:, None, :, None, :].expand(bsz, 1, t, group, keys).reshape(bsz, 1, t * group, keys)


def _set_additive(bias: torch.Tensor, visible: torch.Tensor) -> None:
    """0 where visible, -inf elsewhere, written into `bias` (a view of rows padded to 16
    elements, batch._neg_inf_rows: the padding keeps its -inf)."""
    bias.fill_(float("-inf")).masked_fill_(visible, 0.0)


def tree_structure(parents: torch.Tensor, cu_seqlens: torch.Tensor, pad_index: torch.Tensor,
                   batch: int, max_nodes: int, max_depth: int):
    """The forest's shape over the padded [B, T] layout, by pointer jumping: ceil(log2 D)
    doublings of each row's ancestor list (a node's ancestors w..2w-1 are its w-th
    ancestor's 0..w-1). Returns (par_pad [B*T] local parent or -1, pad_row [B, T] bool,
    depth [B*T] strict ancestors, table [B*T, D] local ancestor at each depth or -1,
    anc [B, T, T] bool: anc[b, i, j] = j on i's root path, i included)."""
    bsz, t, d = batch, max_nodes, max_depth
    dev = pad_index.device
    rows = bsz * t  # and row `rows` is a sentinel, every root's parent and its own
    par_pad = torch.full((rows,), -1, dtype=torch.int64, device=dev)
    par_pad.index_copy_(0, pad_index, parents.to(torch.int64))
    sizes = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    local = torch.arange(t, device=dev)
    pad_row = local[None, :] >= sizes[:, None]
    ids = torch.arange(rows + 1, device=dev)
    start = ids - ids % t  # b*T, the row of the request's local 0
    up = torch.where(torch.cat([par_pad, par_pad.new_full((1,), -1)]) >= 0,
                     start + torch.cat([par_pad, par_pad.new_zeros(1)]), rows)
    chain = torch.where(torch.cat([pad_row.view(-1), pad_row.new_ones(1)]), rows, ids)[:, None]
    while chain.shape[1] < d:  # chain[r, k]: r's k-th ancestor, the sentinel past the root
        chain = torch.cat([chain, chain.index_select(0, up.index_select(0, chain[:, -1]))], 1)
    chain = chain[:rows, :d]
    ancestors = torch.where(chain < rows, chain - start[:rows, None], -1)
    depth = (ancestors[:, 1:] >= 0).sum(1)
    back = depth[:, None] - torch.arange(d, device=dev)[None, :]  # column k holds depth k
    table = torch.where(back >= 0, ancestors.gather(1, back.clamp(min=0)), -1)
    # j is on i's path iff i's ancestor at depth(j) is j (padded i: -1; padded j: past i's tree)
    at = table.view(bsz, t, d).gather(2, depth.view(bsz, 1, t).expand(bsz, t, t))
    anc = at == local[None, None, :]
    return par_pad, pad_row, depth, table, anc


def refill_tree(tb: _TreeBatch, parents: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor,
                rope: _Rope, *, kernel: Optional[bool] = None) -> None:
    """Recompute in place every array of `tb` that depends on the forest's parents, the
    node tokens and the committed lengths, exactly as prepare_tree builds them, with device
    ops of shapes fixed by tb's signature (capturable; see the module docstring for what
    the caller must keep). parents [N] local (-1 = root), tokens [N], base [B] committed
    lengths: integer tensors (int32 or int64) on tb's device. Host fields (host_*) are not touched:
    TreeInputs.load sets them.

    kernel: one launch of kernels.tree_metadata instead of ~90 torch ops (default: on CUDA
    where the mask is the tree part alone, split and varlen modes; the dense [cache | tree]
    mask is the torch ops' alone)."""
    if kernel is None:
        kernel = tb.base.is_cuda and tb.attn_bias is None
    if kernel:
        _refill_tree_kernel(tb, parents, tokens, base, rope)
        return
    bsz, t, n = tb.batch, tb.max_nodes, tb.n_nodes
    par_pad, pad_row, depth, table, anc = tree_structure(parents, tb.cu_seqlens, tb.pad_index,
                                                         bsz, t, tb.max_depth)
    base = base.to(torch.int64)
    node_b = torch.div(tb.pad_index, t, rounding_mode="floor")
    node_base = base.index_select(0, node_b)
    tb.tokens.copy_(tokens)
    tb.parents.copy_(parents)
    tb.base.copy_(base)
    tb.depths.copy_(depth.index_select(0, tb.pad_index))
    torch.add(node_base, tb.depths, out=tb.positions)
    torch.add(node_base, tb.pad_index - node_b * t, out=tb.kv_pos)
    cos, sin = rope.at(tb.positions, tb.kv_limit)
    tb.cos.copy_(cos)
    tb.sin.copy_(sin)
    tb.path_table.copy_(table.index_select(0, tb.pad_index))
    par = par_pad.view(bsz, t)
    rows = torch.arange(bsz, device=par.device)[:, None] * (t + 1) + par + 1
    tb.parent_rows.copy_(rows.t())
    tb.sglang_parents.copy_(par.clamp(min=0))
    if tb.layer_parents.numel():
        tb.layer_parents.view(-1, n).copy_(parents[None, :])
    if tb.kv_used is not None:
        tb.kv_used.copy_(base)
    if tb.attn_bias is not None:  # dense: one mask over [cache | tree]
        limit = tb.kv_limit
        pos = torch.arange(limit, device=base.device)
        rel = pos[None, :] - base[:, None]  # [B, L] position relative to the tree's start
        in_tree = (rel >= 0) & (rel < t)
        tree_vis = torch.gather(anc, 2, rel.clamp(0, t - 1)[:, None, :].expand(bsz, t, limit))
        vis = (pos[None, None, :] < base[:, None, None]) | (tree_vis & in_tree[:, None, :])
        vis[..., 0] |= pad_row  # padded rows see one key, so they stay finite (and are dropped)
        _set_additive(tb.attn_bias, _fold(vis, tb.gqa_group))
    else:  # split / varlen: the tree part only; padded rows see their own (zero) key
        _set_additive(tb.tree_bias, _fold(anc | torch.diag_embed(pad_row), tb.gqa_group))


def _refill_tree_kernel(tb: _TreeBatch, parents: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor,
                        rope: _Rope) -> None:
    from bole_cli.kernels.tree_metadata import tree_metadata

    if tb.attn_bias is not None:
        raise InputError("refill_tree: the kernel writes the tree mask of the split and varlen modes, "
                         "not the dense [cache | tree] mask; refill this batch with kernel=False")
    rope_cos, rope_sin = rope.rows(tb.kv_limit, tb.base.device)
    tree_metadata(parents, tokens, base, tb.cu_seqlens, rope_cos, rope_sin, max_nodes=tb.max_nodes,
                  max_depth=tb.max_depth, tokens=tb.tokens, parents=tb.parents, base=tb.base, depths=tb.depths,
                  positions=tb.positions, kv_pos=tb.kv_pos, cos=tb.cos, sin=tb.sin, path_table=tb.path_table,
                  parent_rows=tb.parent_rows, sglang_parents=tb.sglang_parents, layer_parents=tb.layer_parents,
                  kv_used=tb.kv_used, tree_bias=tb.tree_bias, group=tb.gqa_group)


def refill_decode(db: _DecodeBatch, tokens: torch.Tensor, base: torch.Tensor, rope: _Rope) -> None:
    """refill_tree for a decode step: tokens [B], base [B] committed lengths (the new
    token's position), on db's device."""
    base = base.to(torch.int64)
    db.tokens.copy_(tokens)
    db.positions.copy_(base)
    cos, sin = rope.at(db.positions, db.kv_limit)
    db.cos.copy_(cos)
    db.sin.copy_(sin)
    if db.kv_used is not None:
        db.kv_used.copy_(base + 1)
    if db.attn_bias is not None:
        vis = torch.arange(db.kv_limit, device=base.device)[None, :] <= base[:, None]
        _set_additive(db.attn_bias, vis.view(db.batch, 1, 1, db.kv_limit))


def _ints(name: str, values, count: int, what: str) -> list[int]:
    vals = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(vals) != count:
        raise InputError(f"{name}: {len(vals)} entries; the bucket has {count} {what}")
    try:
        return [operator.index(v) for v in vals]
    except TypeError:
        raise InputError(f"{name}: every entry must be an integer") from None


class _PinnedInts:
    """One int64 host buffer (pinned on CUDA) and its device twin: `send` writes the host
    buffer and starts one non_blocking copy, waiting first for the previous copy (which
    must have read the buffer before it is overwritten; long done by then)."""

    def __init__(self, size: int, device: torch.device):
        self.host = torch.empty(size, dtype=torch.int64, pin_memory=device.type == "cuda")
        self._host_np = self.host.numpy()
        self.device = torch.empty(size, dtype=torch.int64, device=device)
        self._copied: Optional[torch.cuda.Event] = None

    def send(self, values: list[int]) -> None:
        if self._copied is not None:
            self._copied.synchronize()
        self._host_np[:] = values
        self.device.copy_(self.host, non_blocking=True)
        if self.device.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()


class DecodeInputs:
    """TreeInputs for a decode step: tokens | base in one buffer, one copy; `tokens` and
    `base` are the device views refill_decode takes."""

    def __init__(self, db: _DecodeBatch):
        self.db = db
        self._buffer = _PinnedInts(2 * db.batch, db.positions.device)
        self.tokens, self.base = self._buffer.device[:db.batch], self._buffer.device[db.batch:]

    def load(self, tokens: Sequence[int], base: Sequence[int]) -> None:
        """Check a step against db's bucket (InputError naming the field), then copy it."""
        db = self.db
        tok = _ints("tokens", tokens, db.batch, "requests")
        lens = _ints("base", base, db.batch, "requests")
        for b, n0 in enumerate(lens):
            if n0 < 0 or n0 + 1 > db.kv_limit:
                raise InputError(f"base: request {b} has committed length {n0}; the bucket reads "
                                 f"0..{db.kv_limit} keys (kv_limit)")
            if db.attn_bias is None and db.kv_used is None and n0 != db.kv_limit - 1:
                raise InputError(f"base: request {b} has committed length {n0}; the unmasked bucket "
                                 f"bakes in {db.kv_limit - 1} for every request")
        self._buffer.send(tok + lens)
        db.host_kv_lens = lens


class TreeInputs:
    """The host side of a refilled tree step: `load` checks a step against tb's bucket in
    O(N) Python, packs parents | tokens | base into ONE (pinned, on CUDA) int64 host buffer
    and copies it with one non_blocking H2D copy; `parents`, `tokens`, `base` are the
    device views refill_tree takes (stable addresses, so a graph captures them).

        inputs = TreeInputs(tb)
        inputs.load(parents, tokens, base)            # each step, on the host
        refill_tree(tb, inputs.parents, inputs.tokens, inputs.base, rope)  # in the graph

    The copy runs on the current stream, so it lands after the previous replay has read
    the device buffer; `load` waits for the previous copy only before overwriting the
    host buffer (long done by then). Tokens are not range-checked (the vocabulary is the
    model's).
    """

    def __init__(self, tb: _TreeBatch):
        self.tb = tb
        n = tb.n_nodes
        self._buffer = _PinnedInts(2 * n + tb.batch, tb.base.device)
        dev = self._buffer.device
        self.parents, self.tokens, self.base = dev[:n], dev[n:2 * n], dev[2 * n:]

    def check(self, parents: Sequence[int], tokens: Sequence[int], base: Sequence[int]):
        """(parents, tokens, base, depths, single_root) as int lists, or InputError naming
        the field that the bucket cannot take."""
        tb = self.tb
        par = _ints("parents", parents, tb.n_nodes, "nodes")
        tok = _ints("tokens", tokens, tb.n_nodes, "nodes")
        lens = _ints("base", base, tb.batch, "requests")
        depth = [0] * tb.n_nodes
        single_root, g = True, 0
        for b, size in enumerate(tb.host_sizes):
            n0 = lens[b]
            if n0 < 0 or n0 + size > tb.kv_limit:
                raise InputError(f"base: request {b} has committed length {n0}; with its {size} nodes "
                                 f"the bucket reads 0..{tb.kv_limit} keys (kv_limit)")
            if tb.split_base is not None and n0 != tb.split_base:
                raise InputError(f"base: request {b} has committed length {n0}; the split bucket "
                                 f"bakes in {tb.split_base} for every request")
            if tb.kv_used is not None and n0 < 1:
                raise InputError(f"base: request {b} has no committed key; the varlen bucket needs one")
            for i in range(size):
                p = par[g]
                if not -1 <= p < i:
                    raise InputError(f"parents: node {g} (request {b}, local {i}) has parent {p}; "
                                     f"parents must be -1 or a local index before the node")
                if p < 0:
                    single_root &= i == 0
                else:
                    depth[g] = depth[g - i + p] + 1
                    if depth[g] >= tb.max_depth:
                        raise InputError(f"parents: node {g} (request {b}, local {i}) has {depth[g] + 1} "
                                         f"nodes on its root path; the bucket holds {tb.max_depth} (max_depth)")
                g += 1
        return par, tok, lens, depth, single_root

    def load(self, parents: Sequence[int], tokens: Sequence[int], base: Sequence[int]) -> None:
        """Check a step, write the host buffer and start its copy; sets tb's host fields
        (host_kv_lens, host_depths, host_single_root) for the host-side commit."""
        par, tok, lens, depth, single_root = self.check(parents, tokens, base)
        self._buffer.send(par + tok + lens)
        tb = self.tb
        tb.host_kv_lens, tb.host_depths, tb.host_single_root = lens, depth, single_root
