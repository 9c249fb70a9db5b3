"""Attention of a step's queries to each request's committed keys, split along the keys
(flash-decoding), read in place from the KV cache (docs/design.md §8, "The decode step").

A decode step has one query per request (G rows per KV head), so a kernel that gives each
(request, KV head) one program reads a 4096-key cache with 4 programs at batch 1, a few
percent of the GPU's bandwidth. Here the keys are cut into `splits` chunks, each program
keeps its chunk's running max, sum and weighted values (online softmax, float32), and a
second pass merges the chunks exactly. The result comes with its log-sum-exp, so a tree
verify merges it with its small masked tree part (runtime/attention.split_tree_attention).

Queries q [B, H_kv, R, D] (R rows per KV head: the GQA group of each query token); caches
[S, H_kv, L_max, D] (one layer's); request b reads slot slots[b]'s first used[b] keys.
Rows of a request with no key get out 0 and lse -inf; slots outside the pool read nothing
and give NaN; used[b] past the cache length reads the whole slot, never beyond.

A tree verify's own keys sit in the cache right after the committed ones (its scratch), so
the tree part is read here too when `tree_bias` [B, 1|H_kv, R, T] is given: row r also sees
key used[b] + c, for c < T, with tree_bias[b, ., r, c] added to its score (0 for an
ancestor or itself, -inf otherwise). The whole attention is then this kernel, where the
tree part alone took six or more launches (docs/design.md §8).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import ACTIVATION_DTYPES, check_index_vector, check_last_contiguous, check_tensor

TARGET_PROGRAMS = 264  # about two programs per SM of an H100/H200: enough splits to fill it
MIN_SPLIT_KEYS = 256


@triton.jit(do_not_specialize=["tree_t"])
def _cache_attention_part(q, k_cache, v_cache, slots, used, o_part, m_part, l_part, out, lse, tree_bias, tree_cu,
                          n_slots, l_max, rows, split_keys, scale, s_qb, s_qh, s_qt, s_qg, s_kn, s_kh, s_kl, s_vn,
                          s_vh, s_vl, s_ob, s_oh, s_ot, s_og, s_lb, s_lh, group, tree_t, s_tb, s_th, s_tr,
                          H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, BL: tl.constexpr,
                          FINAL: tl.constexpr, TREE: tl.constexpr, SIZES: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // H
    h = bh % H
    n_splits = tl.num_programs(1)
    offs_r = tl.program_id(2) * BR + tl.arange(0, BR)
    rmask = offs_r < rows
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    slot = tl.load(slots + b).to(tl.int64)
    in_pool = (slot >= 0) & (slot < n_slots)
    safe = tl.where(in_pool, slot, 0)
    base = tl.load(used + b).to(tl.int32)
    tree_n = tree_t  # the tree's keys (0: no tree); its own node count when the offsets are given
    if SIZES:
        tree_n = tl.maximum(tl.minimum(tl.load(tree_cu + b + 1) - tl.load(tree_cu + b), tree_t), 0)
    n_keys = tl.minimum(tl.where(in_pool, base + tree_n, 0), l_max)  # never past the cache
    start = split * split_keys
    end = tl.minimum(start + split_keys, n_keys)
    node, g = offs_r // group, offs_r % group  # row r: query token r // group, its head r % group
    qp = q + b.to(tl.int64) * s_qb + h * s_qh + (node * s_qt + g * s_qg)[:, None] + offs_d[None, :]
    qt = tl.load(qp, mask=rmask[:, None] & dmask[None, :], other=0.0)
    kb = k_cache + safe * s_kn + h * s_kh
    vb = v_cache + safe * s_vn + h * s_vh
    m = tl.full((BR,), float("-inf"), tl.float32)
    l = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    for j in range(start, end, BL):
        offs_l = j + tl.arange(0, BL)
        lmask = offs_l < end
        kt = tl.load(kb + offs_l[:, None] * s_kl + offs_d[None, :], mask=lmask[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)).to(tl.float32) * scale
        if TREE:  # the tree's keys: each row's ancestors and itself (the bias is 0 there, -inf elsewhere)
            col = offs_l - base
            tb = tree_bias + b.to(tl.int64) * s_tb + h * s_th + offs_r[:, None] * s_tr + col[None, :]
            s += tl.load(tb, mask=rmask[:, None] & (lmask & (col >= 0))[None, :], other=0.0).to(tl.float32)
        s = tl.where(lmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet (masked tree keys)
        alpha = tl.exp(m - m_use)
        p = tl.exp(s - m_use[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        vt = tl.load(vb + offs_l[:, None] * s_vl + offs_d[None, :], mask=lmask[:, None] & dmask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt).to(tl.float32)
        m = m_new
    poison = tl.where(in_pool, 0.0, float("nan"))
    if FINAL:  # one split: normalise here
        has = l > 0
        o = tl.where(has[:, None], acc / tl.where(has, l, 1.0)[:, None], 0.0) + poison
        op = out + b.to(tl.int64) * s_ob + h * s_oh + (node * s_ot + g * s_og)[:, None] + offs_d[None, :]
        tl.store(op, o.to(out.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])
        ls = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), float("-inf")) + poison
        tl.store(lse + b.to(tl.int64) * s_lb + h * s_lh + offs_r, ls, mask=rmask)
    else:
        part = (bh.to(tl.int64) * n_splits + split) * rows + offs_r
        tl.store(o_part + part[:, None] * BD + offs_d[None, :], acc, mask=rmask[:, None])
        tl.store(m_part + part, m, mask=rmask)
        tl.store(l_part + part, l, mask=rmask)


@triton.jit
def _cache_attention_merge(o_part, m_part, l_part, out, lse, slots, n_slots, rows, n_splits,
                           s_ob, s_oh, s_ot, s_og, s_lb, s_lh, group,
                           H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    slot = tl.load(slots + b).to(tl.int64)
    poison = tl.where((slot >= 0) & (slot < n_slots), 0.0, float("nan"))
    offs_r = tl.program_id(1) * BR + tl.arange(0, BR)
    rmask = offs_r < rows
    offs_d = tl.arange(0, BD)
    mx = tl.full((BR,), float("-inf"), tl.float32)
    for s in range(0, n_splits):
        part = (bh.to(tl.int64) * n_splits + s) * rows + offs_r
        mx = tl.maximum(mx, tl.load(m_part + part, mask=rmask, other=float("-inf")))
    safe_mx = tl.where(mx == float("-inf"), 0.0, mx)
    total = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    for s in range(0, n_splits):
        part = (bh.to(tl.int64) * n_splits + s) * rows + offs_r
        w = tl.exp(tl.load(m_part + part, mask=rmask, other=float("-inf")) - safe_mx)
        total += w * tl.load(l_part + part, mask=rmask, other=0.0)
        acc += w[:, None] * tl.load(o_part + part[:, None] * BD + offs_d[None, :], mask=rmask[:, None], other=0.0)
    has = total > 0
    o = tl.where(has[:, None], acc / tl.where(has, total, 1.0)[:, None], 0.0) + poison
    node, g = offs_r // group, offs_r % group
    op = out + b.to(tl.int64) * s_ob + h * s_oh + (node * s_ot + g * s_og)[:, None] + offs_d[None, :]
    tl.store(op, o.to(out.dtype.element_ty), mask=rmask[:, None] & (offs_d < D)[None, :])
    ls = tl.where(has, safe_mx + tl.log(tl.where(has, total, 1.0)), float("-inf")) + poison
    tl.store(lse + b.to(tl.int64) * s_lb + h * s_lh + offs_r, ls, mask=rmask)


def attention_splits(batch: int, kv_heads: int, row_blocks: int, max_keys: int) -> int:
    """Chunks along the keys: enough programs to fill the GPU, no chunk under
    MIN_SPLIT_KEYS keys (a pure function of the shapes, so a CUDA graph keeps it)."""
    programs = max(1, batch * kv_heads * row_blocks)
    want = max(1, -(-TARGET_PROGRAMS // programs))
    return max(1, min(want, -(-max_keys // MIN_SPLIT_KEYS)))


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    used: torch.Tensor, *, max_keys: Optional[int] = None, scale: Optional[float] = None,
                    tree_bias: Optional[torch.Tensor] = None, tree_cu: Optional[torch.Tensor] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H_kv, R, D] in q's dtype, lse [B, H_kv, R] float32) of q against the first
    used[b] keys of slot slots[b]. max_keys: a bound on the keys read (default the cache
    length), which sets the number of key chunks (give the step's bucket so a graph holds it).
    tree_bias [B, 1|H_kv, R, T] (last dimension contiguous): keys used[b] .. used[b] + T - 1
    too, tree_bias[b, ., r, c] added to row r's score of key used[b] + c; with tree_cu [B + 1]
    (the packed forest's offsets) only request b's own tree_cu[b + 1] - tree_cu[b] of them
    (the rest of its padded columns is never read: nothing wrote it this step). max_keys must
    cover used[b] + its tree keys.

    q may also be [B, H_kv, T, G, D] (T query tokens of G heads each, any strides: a
    verify's q as [B, T, H_kv, G, D] transposed, no copy), row r = t G + g; out then has
    that shape too, a view of a [B, T, H_kv, G, D] buffer (the token-major rows o_proj
    reads, again no copy)."""
    five = isinstance(q, torch.Tensor) and q.dim() == 5
    check_tensor("q", q, 5 if five else 4, ACTIVATION_DTYPES)
    check_last_contiguous("q", q)
    dev = q.device
    if five:  # rows r = t G + g of token t's head g
        bsz, hkv, tokens, group, d = q.shape
        rows, q_rows = tokens * group, (q.stride(2), q.stride(3))
    else:  # one token of R rows
        bsz, hkv, rows, d = q.shape
        group, q_rows = max(rows, 1), (0, q.stride(2))
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, 4, (q.dtype,), dev)
        check_last_contiguous(name, c)
        if c.shape[1] != hkv or c.shape[3] != d:
            raise InputError(f"{name}: expected [S, {hkv}, L, {d}] for q {tuple(q.shape)}, got {tuple(c.shape)}")
    if k_cache.shape != v_cache.shape:
        raise InputError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}")
    slots = check_index_vector("slots", slots, bsz, dev)
    used = check_index_vector("used", used, bsz, dev)
    n_slots, _, lmax, _ = k_cache.shape
    tree_t = 0
    if tree_bias is not None:
        check_tensor("tree_bias", tree_bias, 4, ACTIVATION_DTYPES, dev)
        if (tree_bias.shape[0] != bsz or tree_bias.shape[1] not in (1, hkv) or tree_bias.shape[2] != rows
                or tree_bias.shape[3] < 1):
            raise InputError(f"tree_bias: expected [{bsz}, 1 or {hkv}, {rows}, T] for q {tuple(q.shape)}, "
                             f"got {tuple(tree_bias.shape)}")
        check_last_contiguous("tree_bias", tree_bias)
        tree_t = tree_bias.shape[3]
    if tree_cu is not None:
        if tree_bias is None:
            raise InputError("tree_cu: only with tree_bias (the tree's node offsets)")
        tree_cu = check_index_vector("tree_cu", tree_cu, bsz + 1, dev)
    max_keys = lmax if max_keys is None else min(int(max_keys), lmax)
    scale = d ** -0.5 if scale is None else float(scale)
    if five:
        out = torch.empty(bsz, tokens, hkv, group, d, device=dev, dtype=q.dtype).transpose(1, 2)
        o_rows = (out.stride(2), out.stride(3))
    else:
        out = torch.empty(bsz, hkv, rows, d, device=dev, dtype=q.dtype)
        o_rows = (0, out.stride(2))
    lse = torch.empty(bsz, hkv, rows, device=dev, dtype=torch.float32)
    if bsz == 0 or rows == 0:
        return out, lse
    br = 16
    bd = triton.next_power_of_2(d)
    row_blocks = triton.cdiv(rows, br)
    splits = attention_splits(bsz, hkv, row_blocks, max(max_keys, 1))
    split_keys = triton.cdiv(triton.cdiv(max(max_keys, 1), splits), 64) * 64
    final = splits == 1
    n_part = 1 if final else bsz * hkv * splits * rows
    o_part = torch.empty(n_part, bd, device=dev, dtype=torch.float32)
    m_part = torch.empty(n_part, device=dev, dtype=torch.float32)
    l_part = torch.empty(n_part, device=dev, dtype=torch.float32)
    strides = (out.stride(0), out.stride(1), *o_rows, lse.stride(0), lse.stride(1), group)
    tb = tree_bias if tree_bias is not None else lse  # never read without a tree
    tb_strides = ((tb.stride(0), tb.stride(1) if tb.shape[1] > 1 else 0, tb.stride(2)) if tree_bias is not None
                  else (0, 0, 0))
    _cache_attention_part[(bsz * hkv, splits, row_blocks)](
        q, k_cache, v_cache, slots, used, o_part, m_part, l_part, out, lse, tb, tree_cu if tree_cu is not None else slots,
        n_slots, lmax, rows, split_keys, scale, q.stride(0), q.stride(1), *q_rows,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), *strides, tree_t, *tb_strides, H=hkv, D=d, BD=bd, BR=br, BL=64, FINAL=final,
        TREE=tree_bias is not None, SIZES=tree_cu is not None, num_warps=4)
    if not final:
        _cache_attention_merge[(bsz * hkv, row_blocks)](
            o_part, m_part, l_part, out, lse, slots, n_slots, rows, splits, *strides, H=hkv, D=d, BD=bd, BR=br, num_warps=4)
    return out, lse
