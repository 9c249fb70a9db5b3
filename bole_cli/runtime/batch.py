"""Device-side metadata of one decode step or one tree verify, checked on the host.

prepare_* checks a step on the host, allocates its arrays and fills them on the device
(runtime/tree_metadata.py: the same refill a captured graph replays); the forward then
runs without a single host synchronisation, so it can be captured in a CUDA graph and
replayed after a refill of its arrays on the device. `signature()` is the graph bucket:
every Python int the forward bakes in.

Conventions: request b owns packed nodes cu[b]:cu[b+1]; local parents (-1 = child of the
committed prefix, several roots allowed); a node's position is its request's committed
KV length plus its number of strict ancestors, so a tree token sits where sequential
decoding along its root path would put it. Tree tokens' K/V are written at
`kv_len + local index` (scratch space past the committed length) and compacted onto the
accepted path by the commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional, Sequence

import torch

from bole_cli.errors import InputError
from bole_cli.runtime.tree_metadata import refill_decode, refill_tree


@dataclass
class Rope:
    """Partial rotary embedding over the first `dim` channels of each head (base `theta`)."""

    dim: int
    theta: float = 10_000_000.0
    _rows: dict = field(default_factory=dict, repr=False, compare=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.dim // 2
        inv = self.theta ** (-torch.arange(half, device=positions.device, dtype=torch.float64) / max(half, 1))
        ang = positions.to(torch.float64)[:, None] * inv[None, :]
        return torch.cos(ang).float(), torch.sin(ang).float()

    def rows(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """`tables` of positions 0..P-1 (P >= n, a power of two), built once and kept: a
        captured graph that reads them holds their addresses."""
        size = max(1024, 1 << max(n - 1, 0).bit_length())
        key = (str(torch.device(device)), size)
        if key not in self._rows:
            self._rows[key] = self.tables(torch.arange(size, device=device))
        return self._rows[key]

    def at(self, positions: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`tables(positions)` gathered from the kept rows of positions below `limit` (a
        bucket's kv_limit, which bounds them), instead of computed every step."""
        cos, sin = self.rows(limit, positions.device)
        idx = positions.clamp(0, cos.shape[0] - 1)  # a position past the bucket is its host check's to refuse
        return cos.index_select(0, idx), sin.index_select(0, idx)


class _Prepared:
    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)}

    def signature(self) -> tuple:
        return tuple((f.name, getattr(self, f.name) if not isinstance(getattr(self, f.name), torch.Tensor)
                      else tuple(getattr(self, f.name).shape))
                     for f in fields(self) if not f.name.startswith("host_"))


def _contiguous_start(slots: list[int]) -> Optional[int]:
    if slots and slots == list(range(slots[0], slots[0] + len(slots))):
        return slots[0]
    return None


def _check_slots(slots: list[int], n_slots: int) -> None:
    if len(set(slots)) != len(slots):
        raise InputError(f"slots: a slot appears twice in {slots}")
    for s in slots:
        if not 0 <= s < n_slots:
            raise InputError(f"slots: {s} is outside the cache's 0..{n_slots - 1}")


@dataclass
class DecodeBatch(_Prepared):
    """One token for each of B requests."""

    batch: int
    kv_limit: int  # keys the attention reads: max committed length + 1 (or a bucket above)
    slot_start: Optional[int]  # slots form a contiguous range starting here (cache views)
    tokens: torch.Tensor  # [B] int64
    slots: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64 = committed length
    cos: torch.Tensor  # [B, rope/2] float32
    sin: torch.Tensor
    attn_bias: Optional[torch.Tensor]  # [B, 1, 1, kv_limit] additive, None when not needed
    kv_used: Optional[torch.Tensor]  # [B] int32 keys each request reads (varlen mode), else None
    parents: torch.Tensor  # [B] int32 (all -1): a one-node tree per request, for the tree ops
    cu_seqlens: torch.Tensor  # [B+1] int32
    accepted: torch.Tensor  # [B] int64 zeros
    host_slots: list[int]
    host_kv_lens: list[int]


def _varlen_ok(varlen: bool, slots: list[int]) -> bool:
    """Varlen attention reads the slots' keys in place: the slots must increase."""
    return varlen and all(a < b for a, b in zip(slots, slots[1:]))


def prepare_decode(tokens, slots: Sequence[int], kv_lens: Sequence[int], *, rope: Rope,
                   dtype: torch.dtype, device, n_slots: int, max_len: int,
                   kv_bucket: int = 1, varlen: bool = False) -> DecodeBatch:
    """varlen: when the requests' lengths differ or the read is bucketed, attend to each
    request's keys with flash varlen (runtime/attention.py) instead of an additive mask."""
    slots = [int(s) for s in slots]
    _check_slots(slots, n_slots)
    bsz = len(slots)
    lens = [int(kv_lens[s]) for s in slots]
    need = max(lens) + 1
    limit = min(max_len, -(-need // kv_bucket) * kv_bucket)
    if need > max_len:
        raise InputError(f"decode: a request needs {need} KV positions; the cache holds {max_len}")
    tok = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    if tok.numel() != bsz:
        raise InputError(f"decode: {tok.numel()} tokens for {bsz} slots")
    dev = torch.device(device)
    bias = used = None
    if any(n + 1 != limit for n in lens):
        if _varlen_ok(varlen, slots):
            used = torch.empty(bsz, dtype=torch.int32, device=dev)
        else:
            bias = _neg_inf_rows((bsz, 1, 1, limit), dtype, dev)
    half = rope.dim // 2
    db = DecodeBatch(
        batch=bsz, kv_limit=limit, slot_start=_contiguous_start(slots),
        tokens=torch.empty(bsz, dtype=torch.int64, device=dev),
        slots=torch.tensor(slots, dtype=torch.int64, device=dev),
        positions=torch.empty(bsz, dtype=torch.int64, device=dev),
        cos=torch.empty(bsz, half, device=dev, dtype=torch.float32),
        sin=torch.empty(bsz, half, device=dev, dtype=torch.float32),
        attn_bias=bias, kv_used=used,
        parents=torch.full((bsz,), -1, dtype=torch.int32, device=dev),
        cu_seqlens=torch.arange(bsz + 1, dtype=torch.int32, device=dev),
        accepted=torch.zeros(bsz, dtype=torch.int64, device=dev),
        host_slots=slots, host_kv_lens=lens,
    )
    refill_decode(db, tok.to(dev), torch.tensor(lens, dtype=torch.int64, device=dev), rope)
    return db


def _neg_inf_rows(shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """An additive mask's storage, all -inf (tree_metadata writes the 0s). Rows are padded
    to 16 elements (a view is returned) so SDPA's memory-efficient kernel takes the mask as
    is instead of re-padding a copy in every attention layer."""
    width = shape[-1]
    padded = -(-width // 16) * 16
    bias = torch.full(tuple(shape[:-1]) + (padded,), float("-inf"), dtype=dtype, device=device)
    return bias[..., :width]


@dataclass
class TreeBatch(_Prepared):
    """A packed forest of draft trees over B requests (docs/design.md §3 tree arrays)."""

    batch: int
    n_nodes: int
    max_nodes: int  # T: the largest tree (padded per-request layout [B, T])
    max_depth: int  # D: nodes on the longest root path
    kv_limit: int  # keys the attention reads
    slot_start: Optional[int]
    gqa_group: int
    n_gdn_layers: int
    n_slots: int
    tokens: torch.Tensor  # [N] int64
    slots: torch.Tensor  # [B] int64 (state_indices)
    parents: torch.Tensor  # [N] int32, local
    cu_seqlens: torch.Tensor  # [B+1] int32
    depths: torch.Tensor  # [N] int64, strict ancestors (0 for a root)
    positions: torch.Tensor  # [N] int64 = committed length + depth
    cos: torch.Tensor
    sin: torch.Tensor
    node_slot: torch.Tensor  # [N] int64: the cache slot of each node's request
    kv_pos: torch.Tensor  # [N] int64: scratch KV position = committed length + local index
    pad_index: torch.Tensor  # [N] int64: row b*T + local in the padded layout
    split_base: Optional[int]  # every request's committed length, when attention is split
    attn_bias: Optional[torch.Tensor]  # [B, 1, T*G, kv_limit] additive over cache | tree (dense mode)
    tree_bias: Optional[torch.Tensor]  # [B, 1, T*G, T] additive over the tree only (split, varlen modes)
    kv_used: Optional[torch.Tensor]  # [B] int32 committed keys each request reads (varlen mode)
    base: torch.Tensor  # [B] int64 committed lengths
    path_table: torch.Tensor  # [N, D] int64: local index of the ancestor at each depth, -1 pad
    parent_rows: torch.Tensor  # [T, B] int64: snapshot row of each step's parent (b*(T+1) + p + 1)
    sglang_parents: torch.Tensor  # [B, T] int64: SGLang's retrieve_parent_token (0 for roots/pad)
    layer_slots: torch.Tensor  # [L*B] int64: slot + l*S, to commit every layer's conv in one call
    layer_parents: torch.Tensor  # [L*N] int32
    layer_cu_seqlens: torch.Tensor  # [L*B+1] int32
    host_slots: list[int]
    host_kv_lens: list[int]
    host_sizes: list[int]
    host_depths: list[int]
    host_single_root: bool  # only node 0 of each tree is a root (what SGLang's verify supports)

    @property
    def full(self) -> bool:
        """Every tree has T nodes: the packed rows are the padded layout (no copy either way)."""
        return self.n_nodes == self.batch * self.max_nodes

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] packed rows -> [B, T, ...], zeros past each request's tree."""
        rest = tuple(x.shape[1:])
        if self.full:
            return x.reshape((self.batch, self.max_nodes) + rest)
        out = x.new_zeros((self.batch * self.max_nodes,) + rest).index_copy_(0, self.pad_index, x)
        return out.view((self.batch, self.max_nodes) + rest)

    def packed(self, x: torch.Tensor) -> torch.Tensor:
        """[B*T, ...] padded rows -> [N, ...]: padded's inverse."""
        return x if self.full else x.index_select(0, self.pad_index)


def forest_arrays(forest) -> tuple[list[int], list[int]]:
    """(parents, cu_seqlens) as int lists from a bole_cli.trees.Forest, a (parents,
    cu_seqlens) pair, or anything with those two attributes."""
    if hasattr(forest, "parents") and hasattr(forest, "cu_seqlens"):
        parents, cu = forest.parents, forest.cu_seqlens
    else:
        parents, cu = forest
    as_list = (lambda x: x.tolist() if hasattr(x, "tolist") else list(x))
    return [int(p) for p in as_list(parents)], [int(c) for c in as_list(cu)]


def prepare_tree(forest, tokens, slots: Sequence[int], kv_lens: Sequence[int], *, rope: Rope,
                 dtype: torch.dtype, device, n_slots: int, max_len: int, gqa_group: int,
                 n_gdn_layers: int, kv_bucket: int = 1, split: bool = False, varlen: bool = False,
                 bias_dtype: Optional[torch.dtype] = None) -> TreeBatch:
    """split: when every request has the same committed length, attend to the cache
    without a mask and to the tree with a small [T*G, T] mask, merging by log-sum-exp
    (HybridModel); else, with varlen, the cache part is flash varlen over each request's
    committed keys (runtime/attention.py) and the tree part the same small mask; otherwise
    one additive mask over [cache | tree]. bias_dtype: the tree mask's dtype in the split
    and varlen modes (the tree part is computed in float32/float64)."""
    parents, cu = forest_arrays(forest)
    slots = [int(s) for s in slots]
    bsz = len(cu) - 1
    n = len(parents)
    if bsz != len(slots):
        raise InputError(f"forest has {bsz} requests but {len(slots)} slots were given")
    if bsz < 1 or cu[0] != 0 or cu[-1] != n or any(cu[b + 1] < cu[b] for b in range(bsz)):
        raise InputError(f"cu_seqlens {cu} does not partition {n} nodes")
    _check_slots(slots, n_slots)
    tok = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    if tok.numel() != n:
        raise InputError(f"forest has {n} nodes but {tok.numel()} tokens were given")
    lens = [int(kv_lens[s]) for s in slots]
    sizes = [cu[b + 1] - cu[b] for b in range(bsz)]
    t_max = max(max(sizes), 1)

    depth = [0] * n
    node_b, local = [0] * n, [0] * n
    single_root = True
    for b in range(bsz):
        for i in range(sizes[b]):
            g_i = cu[b] + i
            p = parents[g_i]
            if not -1 <= p < i:
                raise InputError(f"parents: node {g_i} (request {b}, local {i}) has parent {p}; "
                                 f"parents must be -1 or a local index before the node")
            node_b[g_i], local[g_i] = b, i
            if p < 0:
                single_root &= i == 0
            else:
                depth[g_i] = depth[cu[b] + p] + 1
    d_max = max((d + 1 for d in depth), default=1)
    need = max(lens[b] + sizes[b] for b in range(bsz))
    if need > max_len:
        raise InputError(f"verify: a request needs {need} KV positions; the cache holds {max_len}")
    limit = min(max_len, -(-need // kv_bucket) * kv_bucket)

    dev = torch.device(device)
    i64 = dict(dtype=torch.int64, device=dev)
    split_base = lens[0] if split and all(x == lens[0] for x in lens) else None
    varlen = split_base is None and _varlen_ok(varlen, slots) and min(lens) > 0
    rows = t_max * gqa_group
    slots_t = torch.tensor(slots, **i64)
    nb = torch.tensor(node_b, **i64)
    lay = torch.arange(n_gdn_layers, **i64)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
    layer_cu = torch.cat([torch.zeros(1, **i64), (cu_t[1:].to(torch.int64)[None, :] + n * lay[:, None]).reshape(-1)])
    half = rope.dim // 2
    tb = TreeBatch(
        batch=bsz, n_nodes=n, max_nodes=t_max, max_depth=d_max, kv_limit=limit,
        slot_start=_contiguous_start(slots), gqa_group=gqa_group, n_gdn_layers=n_gdn_layers,
        n_slots=n_slots, tokens=torch.empty(n, **i64), slots=slots_t,
        parents=torch.empty(n, dtype=torch.int32, device=dev), cu_seqlens=cu_t,
        depths=torch.empty(n, **i64), positions=torch.empty(n, **i64),
        cos=torch.empty(n, half, device=dev, dtype=torch.float32),
        sin=torch.empty(n, half, device=dev, dtype=torch.float32),
        node_slot=slots_t[nb], kv_pos=torch.empty(n, **i64),
        pad_index=nb * t_max + torch.tensor(local, **i64), split_base=split_base,
        attn_bias=None if split_base is not None or varlen else _neg_inf_rows((bsz, 1, rows, limit), dtype, dev),
        tree_bias=_neg_inf_rows((bsz, 1, rows, t_max), bias_dtype or dtype, dev)
        if split_base is not None or varlen else None,
        kv_used=torch.empty(bsz, dtype=torch.int32, device=dev) if varlen else None,
        base=torch.empty(bsz, **i64), path_table=torch.empty(n, d_max, **i64),
        parent_rows=torch.empty(t_max, bsz, **i64), sglang_parents=torch.empty(bsz, t_max, **i64),
        layer_slots=(slots_t[None, :] + n_slots * lay[:, None]).reshape(-1),
        layer_parents=torch.empty(n_gdn_layers * n, dtype=torch.int32, device=dev),
        layer_cu_seqlens=layer_cu.to(torch.int32),
        host_slots=slots, host_kv_lens=lens, host_sizes=sizes, host_depths=depth, host_single_root=single_root,
    )
    refill_tree(tb, torch.tensor(parents, dtype=torch.int32, device=dev), tok.to(dev),
                torch.tensor(lens, **i64), rope)
    return tb
