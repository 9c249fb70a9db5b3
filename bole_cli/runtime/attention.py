"""Tree attention without a dense mask over the KV cache.

Every tree node sees the whole committed cache and its own ancestors in the tree. A
single SDPA call needs an additive mask over [cache | tree] for every query row; its
bytes grow with (tree rows x cache length) and, for GQA models with big groups, rival
the KV cache itself, which would inflate a verify's measured time. When all requests
share one committed length (the calibration sweep's case), the runtime instead runs the
cache part with a mask-free flash kernel that also returns the log-sum-exp, the tree
part (T keys) as a small masked softmax, and merges the two exactly:

    o = (o_c e^{lse_c} + o_t e^{lse_t}) / (e^{lse_c} + e^{lse_t})

The log-sum-exp comes from ATen's private flash / memory-efficient ops; a probe checks
them against the masked SDPA once per (device, dtype, head_dim) and the model falls back
to the dense mask if they misbehave.

When lengths differ, or one CUDA graph must serve many steps (a KV bucket read past the
committed lengths, as `bole bench e2e` runs), the cache part is flash-attention's varlen
kernel over each request's used keys (`seqused_k`), read in place from the cache: one
graph for any lengths, no mask over the cache, so the step reads the keys a serving
engine's paged attention reads. SDPA with an additive mask over the bucket instead runs
the memory-efficient kernel, 2-5x slower per layer at batch 1-16 (experiments/NOTES.md,
I16-d). CUDA only, probed like the split path; the dense mask stays the fallback.

On CUDA with 16-bit activations the cache part is `cache_attention` instead: Bole's
split-key kernel (kernels/cache_attention.py), which reads any lengths in place without a
mask and fills the GPU at batch 1 where one flash program per KV head does not.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    used: torch.Tensor, max_keys: int, tree_bias: Optional[torch.Tensor] = None,
                    tree_cu: Optional[torch.Tensor] = None, launch: Optional[tuple[int, int, int, int, int, int]] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q [B, H_kv, R, D] (or [B, H_kv, T, G, D], T tokens' G heads, any strides;
    out then alike, token-major) against slot slots[b]'s first used[b] keys of one
    layer's cache [S, H_kv, L_max, D], split along the keys (kernels.cache_attention);
    max_keys bounds the keys read (the step's bucket) and fixes the number of key chunks and
    the kernel's default launch.
    tree_bias: a verify's tree keys too (its scratch right after used[b]) under that mask;
    tree_cu: the forest's offsets, so each request reads its own tree's keys only. launch: the
    kernel's launch knobs (None: its default; experiments/component_bench.py sweeps them)."""
    from bole_cli.kernels.cache_attention import cache_attention as kernel

    return kernel(q, k_cache, v_cache, slots, used, max_keys=max_keys, tree_bias=tree_bias, tree_cu=tree_cu,
                  launch=launch)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention (out [B, H, Lq, D], lse [B, H, Lq] float) through the flash kernels."""
    if q.device.type != "cuda":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    if q.dtype in (torch.float16, torch.bfloat16):
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
        return r[0], r[1]
    r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
    return r[0], r[1][..., : q.shape[2]]


def flash_varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, used) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's flash varlen forward, keys cut at `used` per request: (out, lse). The CPU
    tests replace this one call with a reference."""
    r = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, False, False,
                                                seqused_k=used)
    return r[0], r[1]


def varlen_cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slots: torch.Tensor, used: torch.Tensor, *, group: int = 1
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, H_kv, R, D] to the first used[b] keys of cache slot slots[b]
    (k_cache / v_cache one layer's [S, H_kv, L_max, D], contiguous; slots increasing; used
    [B] int32 >= 1).
    group 1: the R rows of a KV head are R queries (a tree's T x G rows); group G: R = G,
    the GQA group as flash's own query heads (one decode token a request). Returns out
    [B, H_kv, R, D] in q's dtype and lse [B, H_kv, R] float32."""
    bsz, hkv, rows, d = q.shape
    n_slots, _, lmax, _ = k_cache.shape
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or n_slots * hkv * lmax >= 2 ** 31:
        raise ValueError("varlen_cache_attention: the layer's cache must be contiguous [S, H_kv, L_max, D] "
                         "with S * H_kv * L_max < 2**31 (int32 key offsets)")
    t, heads = rows // group, hkv * group
    qv = q.view(bsz, hkv, t, group, d).permute(0, 2, 1, 3, 4).reshape(bsz * t, heads, d)
    # slot s, head h, key j sits at row s * H_kv * L_max + j of a [rows, H_kv, D] view whose
    # head stride is L_max * D: the cache read in place
    n = (n_slots - 1) * hkv * lmax + lmax
    k = k_cache.as_strided((n, hkv, d), (d, lmax * d, 1))
    v = v_cache.as_strided((n, hkv, d), (d, lmax * d, 1))
    starts = (slots * (hkv * lmax)).to(torch.int32)
    cu_k = torch.cat([starts, starts[-1:] + lmax])
    cu_q = torch.arange(0, (bsz + 1) * t, t, dtype=torch.int32, device=q.device)
    out, lse = flash_varlen(qv, k, v, cu_q, cu_k, t, lmax, used)
    out = out.view(bsz, t, hkv, group, d).permute(0, 2, 1, 3, 4).reshape(bsz, hkv, rows, d)
    if lse.dim() == 2:  # [heads, total_q]
        lse = lse.view(hkv, group, bsz, t).permute(2, 0, 3, 1)
    else:  # [B, heads, max_q]
        lse = lse[..., :t].reshape(bsz, hkv, group, t).transpose(2, 3)
    return out, lse.reshape(bsz, hkv, rows)


def split_tree_attention(q: torch.Tensor, k_cache: Optional[torch.Tensor], v_cache: Optional[torch.Tensor],
                         k_tree: torch.Tensor, v_tree: torch.Tensor, tree_bias: torch.Tensor,
                         cache_part: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """q [B, H, R, D]; cache keys/values [B, H, L, D] (all visible; None or L = 0 for
    none), or cache_part, the cache's (out, lse) computed already (varlen_cache_attention);
    tree keys/values [B, H, T, D]; tree_bias [B, 1|H, R, T] additive. The tree part is
    computed in tree_bias's dtype. Returns [B, H, R, D] in q's dtype."""
    cdt = tree_bias.dtype
    scores = torch.matmul(q.to(cdt), k_tree.to(cdt).transpose(-1, -2)) * q.shape[-1] ** -0.5 + tree_bias
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), v_tree.to(cdt))
    if cache_part is None and k_cache is not None and k_cache.shape[2] > 0:
        cache_part = attention_lse(q, k_cache, v_cache)
    if cache_part is not None:
        out_c, lse_c = cache_part
        m = torch.maximum(lse, lse_c)
        w_t = torch.exp(lse - m).unsqueeze(-1)
        w_c = torch.exp(lse_c.to(cdt) - m).unsqueeze(-1)
        out = (out * w_t + out_c.to(cdt) * w_c) / (w_t + w_c)
    return out.to(q.dtype)


@functools.lru_cache(maxsize=None)
def split_attention_works(device_type: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Probe split_tree_attention against one masked SDPA call on random data."""
    try:
        gen = torch.Generator(device=device_type).manual_seed(0)
        bsz, heads, cached, tree, rows = 2, 2, 40, 5, 10

        def rnd(*shape):
            return torch.randn(shape, generator=gen, device=device_type, dtype=dtype)

        q, kc, vc, kt, vt = rnd(bsz, heads, rows, head_dim), rnd(bsz, heads, cached, head_dim), \
            rnd(bsz, heads, cached, head_dim), rnd(bsz, heads, tree, head_dim), rnd(bsz, heads, tree, head_dim)
        vis_t = torch.rand(bsz, 1, rows, tree, generator=gen, device=device_type) < 0.5
        vis_t[..., 0] = True
        fdt = torch.float64 if dtype == torch.float64 else torch.float32
        tree_bias = torch.zeros(vis_t.shape, dtype=fdt, device=device_type).masked_fill_(~vis_t, float("-inf"))
        full_vis = torch.cat([torch.ones(bsz, 1, rows, cached, dtype=torch.bool, device=device_type), vis_t], -1)
        want = F.scaled_dot_product_attention(q, torch.cat([kc, kt], 2), torch.cat([vc, vt], 2), attn_mask=full_vis)
        got = split_tree_attention(q, kc, vc, kt, vt, tree_bias)
        tol = 1e-5 if fdt == dtype else 3e-2
        return bool(torch.allclose(got.float(), want.float(), atol=tol, rtol=tol))
    except Exception:  # noqa: BLE001 - any failure means "use the dense mask"
        return False


@functools.lru_cache(maxsize=None)
def varlen_attention_works(device_type: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Probe varlen_cache_attention (both query layouts, slots with gaps, lengths that
    differ, long enough for flash to split the keys, a layer's slice of a cache) against
    masked SDPA on random data. False off CUDA or on any failure."""
    if device_type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    try:
        gen = torch.Generator(device=device_type).manual_seed(0)
        n_slots, hkv, lmax, group, t = 4, 2, 1024, 2, 3
        shape = (2, n_slots, hkv, lmax, head_dim)  # two layers: the runtime passes cache[l]
        kc = torch.randn(shape, generator=gen, device=device_type, dtype=dtype)[1]
        vc = torch.randn(shape, generator=gen, device=device_type, dtype=dtype)[1]
        slots = torch.tensor([0, 2, 3], device=device_type)
        used = torch.tensor([1000, 7, 1], dtype=torch.int32, device=device_type)
        keys = torch.arange(lmax, device=device_type)
        vis = (keys[None, :] < used[:, None].long())[:, None, None, :]  # [B, 1, 1, L]
        for rows, grp in ((t * group, 1), (group, group)):
            q = torch.randn(3, hkv, rows, head_dim, generator=gen, device=device_type, dtype=dtype)
            want = F.scaled_dot_product_attention(q, kc[slots], vc[slots], attn_mask=vis)
            got, lse = varlen_cache_attention(q, kc, vc, slots, used, group=grp)
            s = torch.matmul(q.float(), kc[slots].float().transpose(-1, -2)) * head_dim ** -0.5
            want_lse = torch.logsumexp(s.masked_fill(~vis, float("-inf")), -1)
            if not (torch.allclose(got.float(), want.float(), atol=3e-2, rtol=3e-2)
                    and torch.allclose(lse, want_lse, atol=3e-2, rtol=1e-3)):
                return False
        return True
    except Exception:  # noqa: BLE001 - any failure means "use the dense mask"
        return False
