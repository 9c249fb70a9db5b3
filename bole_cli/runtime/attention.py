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
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention (out [B, H, Lq, D], lse [B, H, Lq] float) through the flash kernels."""
    if q.device.type != "cuda":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    if q.dtype in (torch.float16, torch.bfloat16):
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
        return r[0], r[1]
    r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
    return r[0], r[1][..., : q.shape[2]]


def split_tree_attention(q: torch.Tensor, k_cache: Optional[torch.Tensor], v_cache: Optional[torch.Tensor],
                         k_tree: torch.Tensor, v_tree: torch.Tensor, tree_bias: torch.Tensor) -> torch.Tensor:
    """q [B, H, R, D]; cache keys/values [B, H, L, D] (all visible; None or L = 0 for
    none); tree keys/values [B, H, T, D]; tree_bias [B, 1|H, R, T] additive. The tree part
    is computed in tree_bias's dtype. Returns [B, H, R, D] in q's dtype."""
    cdt = tree_bias.dtype
    scores = torch.matmul(q.to(cdt), k_tree.to(cdt).transpose(-1, -2)) * q.shape[-1] ** -0.5 + tree_bias
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), v_tree.to(cdt))
    if k_cache is not None and k_cache.shape[2] > 0:
        out_c, lse_c = attention_lse(q, k_cache, v_cache)
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
