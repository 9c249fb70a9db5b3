"""Float64-capable PyTorch references for the full-attention layers' kernels (the GDN
layers' are in reference.py): the ground truth their tests compare with, clear rather than
fast.

- `cache_attention_ref`: attention to each request's committed keys (and a verify's tree keys
  after them, under the tree mask), with its log-sum-exp.
- `attention_in_ref`: a full-attention layer's q/k RMSNorm and partial RoPE, k and v into the
  KV cache (the attention_in kernel).
- `kv_compact_ref`: a verify's accepted path moved from the KV scratch to its depths (a copy:
  exact in any dtype).
"""

from __future__ import annotations

from typing import Optional

import torch


def cache_attention_ref(q, k_cache, v_cache, slots, used, *, scale: Optional[float] = None, tree_bias=None,
                        tree_cu=None):
    """(out [B, H_kv, R, D], lse [B, H_kv, R]) in float64: q's rows against slot slots[b]'s
    first min(used[b], L) keys, and with tree_bias [B, 1|H_kv, R, T] the next T keys (those
    within the cache; request b's own tree_cu[b + 1] - tree_cu[b] of them with tree_cu) with
    the bias added to their scores; out 0 and lse -inf for a row
    without a visible key; NaN for a slot outside the pool (cache_attention's contract)."""
    bsz, hkv, rows, d = q.shape
    n_slots, _, lmax, _ = k_cache.shape
    scale = d ** -0.5 if scale is None else scale
    tree_t = 0 if tree_bias is None else tree_bias.shape[3]
    out = torch.zeros(bsz, hkv, rows, d, dtype=torch.float64)
    lse = torch.full((bsz, hkv, rows), float("-inf"), dtype=torch.float64)
    for b in range(bsz):
        slot, base = int(slots[b]), int(used[b])
        own = tree_t if tree_cu is None else max(min(int(tree_cu[b + 1]) - int(tree_cu[b]), tree_t), 0)
        n = min(base + own, lmax)
        if not 0 <= slot < n_slots:
            out[b], lse[b] = float("nan"), float("nan")
            continue
        if n <= 0:
            continue
        s = q[b].double() @ k_cache[slot, :, :n].double().transpose(-1, -2) * scale  # [H, R, n]
        if tree_t:
            cols = torch.arange(n) - base  # key k is the tree's column k - base where that is >= 0
            s[..., cols >= 0] += tree_bias[b, :, :, cols[cols >= 0]].double()
        lse[b] = torch.logsumexp(s, -1)
        seen = torch.isfinite(lse[b])[..., None]
        p = torch.where(seen, torch.exp(s - torch.where(seen, lse[b][..., None], 0.0)), 0.0)
        out[b] = p @ v_cache[slot, :, :n].double()
    return out, lse


def attention_in_ref(proj, q_norm, k_norm, cos, sin, k_cache, v_cache, slots, positions, *, heads: int,
                     kv_heads: int, eps: float, k_out: bool = False):
    """q, gate, k (or None), v from the fused q|gate|k|v projection (kernels.attention_in's
    contract), in float64: rms(x) w per head, the first 2R channels rotated by the rows' cos,
    sin [N, R]; k and v written into the caches at (slots[i], positions[i]), rows outside the
    caches skipped. q and k come back in float64."""
    n, d, half = proj.shape[0], k_cache.shape[-1], cos.shape[-1]

    def normed(x, w):
        x = x.double()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()
        x1, x2 = x[..., :half], x[..., half: 2 * half]
        c, s = cos.double()[:, None], sin.double()[:, None]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], dim=-1)

    qg = proj[:, : 2 * heads * d].view(n, heads, 2 * d)
    q = normed(qg[..., :d], q_norm)
    k = normed(proj[:, 2 * heads * d: (2 * heads + kv_heads) * d].view(n, kv_heads, d), k_norm)
    v = proj[:, (2 * heads + kv_heads) * d:].view(n, kv_heads, d)
    for i in range(n):
        slot, pos = int(slots[i]), int(positions[i])
        if 0 <= slot < k_cache.shape[0] and 0 <= pos < k_cache.shape[2]:
            k_cache[slot, :, pos] = k[i].to(k_cache.dtype)
            v_cache[slot, :, pos] = v[i].to(v_cache.dtype)
    return q, qg[..., d:], (k if k_out else None), v


def kv_compact_ref(k_cache, v_cache, slots, base, accepted, cu_seqlens, path_table) -> None:
    """In place, kernels.kv_compact's contract: for each request b whose slot, accepted node
    and base are valid, the key and value at base + (local index of the accepted node's
    ancestor at depth d) move to base + d in every layer, d in increasing order; a move
    whose source or destination lies past the cache, or whose row is -1, is skipped."""
    n_slots, max_len = k_cache.shape[1], k_cache.shape[3]
    for b in range(slots.shape[0]):
        slot, node, bs = int(slots[b]), int(accepted[b]), int(base[b])
        first = int(cu_seqlens[b]) + node
        if not (0 <= slot < n_slots and node >= 0 and 0 <= first < path_table.shape[0] and bs >= 0):
            continue
        for d in range(path_table.shape[1]):
            row = int(path_table[first, d])
            if row >= 0 and row != d and bs + row < max_len and bs + d < max_len:
                for c in (k_cache, v_cache):
                    c[:, slot, :, bs + d] = c[:, slot, :, bs + row]
