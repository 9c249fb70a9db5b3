"""A full-attention layer's input in one launch: from the fused q|gate|k|v projection, q and k
RMS-normed per head and rotated (partial RoPE), q written out, k and v written into the KV
cache at each row's slot and position (and k out too, for a verify's tree part).

Why: torch.compile splits these pieces into six or seven kernels (the per-head norms are
reductions, the rotation reads each channel's partner half, the cache writes are two index
kernels on top), about 3 us each at a decode step's few rows (experiments/results/runtime/
steps-verify-h200.json); one program a row and head does them all (docs/design.md §8).

Rounding follows the unfused eager path: the norm's result rounds to the activation dtype
before its weight and again after it, the rotary table rounds to the activation dtype, and
the rotation computes in float32 and rounds once (the compiled pieces round only at the end:
the two differ by about a bf16 ulp). A row whose slot or position lies outside the
cache writes nothing there (its q and k are still written).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import (ACTIVATION_DTYPES, check_index_vector, check_last_contiguous, check_tensor)


@triton.jit
def _normed_rope(row, w, cos_row, sin_row, eps, DH: tl.constexpr, DP: tl.constexpr, HALF: tl.constexpr):
    """One head's channels [DP] (DH real): rms-normed times w, the first 2 HALF rotated."""
    d = tl.arange(0, DP)
    dm = d < DH
    x = tl.load(row + d, mask=dm, other=0.0)
    dt = x.dtype
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / DH + eps)
    wv = tl.load(w + d, mask=dm, other=0.0).to(tl.float32)
    xn = ((xf * r).to(dt).to(tl.float32) * wv).to(dt).to(tl.float32)
    rot = d < 2 * HALF
    lo = d < HALF
    partner = tl.where(lo, d + HALF, d - HALF)
    xp = tl.load(row + partner, mask=rot, other=0.0).to(tl.float32)
    wp = tl.load(w + partner, mask=rot, other=0.0).to(tl.float32)
    xpn = ((xp * r).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
    col = tl.where(lo, d, d - HALF)
    c = tl.load(cos_row + col, mask=rot, other=1.0).to(dt).to(tl.float32)
    s = tl.load(sin_row + col, mask=rot, other=0.0).to(dt).to(tl.float32)
    out = tl.where(lo, xn * c - xpn * s, tl.where(rot, xn * c + xpn * s, xn))
    return out.to(dt)


@triton.jit(do_not_specialize=["n_slots", "max_len"])
def _attention_in_kernel(proj, q_norm, k_norm, cos, sin, slots, positions, q_out, k_cache, v_cache, k_out,
                         n_slots, max_len, s_pn, s_qn, s_qh, s_cn, s_sn, s_ks, s_kh, s_kl, s_vs, s_vh, s_vl,
                         s_on, s_oh, eps, HQ: tl.constexpr, HK: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr,
                         HALF: tl.constexpr, K_OUT: tl.constexpr):
    """Program (row n, head c): query head c for c < HQ, else key/value head c - HQ."""
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    row = proj + n * s_pn
    cos_row = cos + n * s_cn
    sin_row = sin + n * s_sn
    d = tl.arange(0, DP)
    dm = d < DH
    if c < HQ:  # q of head c: the first DH of its 2 DH (query | gate) columns
        q = _normed_rope(row + c * 2 * DH, q_norm, cos_row, sin_row, eps, DH, DP, HALF)
        tl.store(q_out + n * s_qn + c * s_qh + d, q.to(q_out.dtype.element_ty), mask=dm)
    else:
        j = c - HQ
        k = _normed_rope(row + (2 * HQ + j) * DH, k_norm, cos_row, sin_row, eps, DH, DP, HALF)
        v = tl.load(row + (2 * HQ + HK + j) * DH + d, mask=dm, other=0.0)
        slot = tl.load(slots + n).to(tl.int64)
        pos = tl.load(positions + n).to(tl.int64)
        ok = (slot >= 0) & (slot < n_slots) & (pos >= 0) & (pos < max_len)
        slot = tl.where(ok, slot, 0)
        pos = tl.where(ok, pos, 0)
        wm = d < tl.where(ok, DH, 0)  # a row outside the cache writes nothing there
        tl.store(k_cache + slot * s_ks + j * s_kh + pos * s_kl + d, k.to(k_cache.dtype.element_ty), mask=wm)
        tl.store(v_cache + slot * s_vs + j * s_vh + pos * s_vl + d, v.to(v_cache.dtype.element_ty), mask=wm)
        if K_OUT:
            tl.store(k_out + n * s_on + j * s_oh + d, k.to(k_out.dtype.element_ty), mask=dm)


def attention_in(proj: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 positions: torch.Tensor, *, heads: int, kv_heads: int, eps: float, k_out: bool = False):
    """proj [N, (2 heads + 2 kv_heads) D]: per row, `heads` (query | gate) pairs of D columns,
    then kv_heads keys, then kv_heads values (K contiguous, rows may be strided); q_norm,
    k_norm [D]; cos, sin [N, R] the rotary rows (R <= D / 2: the first 2R channels of a head
    rotate); k_cache, v_cache [S, kv_heads, L, D] (last dimension contiguous); slots,
    positions [N] the cache slot and position each row's key and value go to.

    Returns q [N, heads, D] (normed, rotated), gate [N, heads, D] (a view of proj), k
    [N, kv_heads, D] (normed, rotated; only with k_out, else None) and v [N, kv_heads, D]
    (a view of proj). eps: the norms' epsilon."""
    check_tensor("proj", proj, 2, ACTIVATION_DTYPES)
    dev, n = proj.device, proj.shape[0]
    check_tensor("k_cache", k_cache, 4, None, dev)
    check_tensor("v_cache", v_cache, 4, None, dev)
    d = k_cache.shape[-1]
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise InputError(f"heads: {heads} query heads over {kv_heads} kv_heads (a positive multiple)")
    if proj.shape[1] != (2 * heads + 2 * kv_heads) * d or d < 1:
        raise InputError(f"proj: expected [N, {(2 * heads + 2 * kv_heads) * d}] ((2 heads + 2 kv_heads) x "
                         f"the cache's head size {d}), got {tuple(proj.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if tuple(t.shape[1:]) != (kv_heads, k_cache.shape[2], d) or t.shape[0] != k_cache.shape[0]:
            raise InputError(f"{name}: expected [S, {kv_heads}, L, {d}] like k_cache, got {tuple(t.shape)}")
        check_last_contiguous(name, t)
    check_last_contiguous("proj", proj)
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        check_tensor(name, t, 1, ACTIVATION_DTYPES, dev)
        if t.shape[0] != d or t.stride(0) != 1:
            raise InputError(f"{name}: expected [{d}] contiguous (the head size), got {tuple(t.shape)}")
    half = cos.shape[-1] if cos.dim() == 2 else -1
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, 2, ACTIVATION_DTYPES, dev)
        if tuple(t.shape) != (n, half) or 2 * half > d:
            raise InputError(f"{name}: expected [{n}, R] with 2R <= {d} like cos, got {tuple(t.shape)}")
        check_last_contiguous(name, t)
    slots = check_index_vector("slots", slots, n, dev)
    positions = check_index_vector("positions", positions, n, dev)
    if not eps >= 0:
        raise InputError(f"eps: the norms' epsilon, at least 0; got {eps!r}")
    qg = proj[:, : 2 * heads * d].view(n, heads, 2 * d)
    gate = qg[..., d:]
    v = proj[:, (2 * heads + kv_heads) * d:].view(n, kv_heads, d)
    q = torch.empty(n, heads, d, dtype=proj.dtype, device=dev)
    k = torch.empty(n, kv_heads, d, dtype=proj.dtype, device=dev) if k_out else None
    if n == 0:
        return q, gate, k, v
    ko = k if k is not None else q
    _attention_in_kernel[(n, heads + kv_heads)](
        proj, q_norm, k_norm, cos, sin, slots, positions, q, k_cache, v_cache, ko, k_cache.shape[0],
        k_cache.shape[2], proj.stride(0), q.stride(0), q.stride(1), cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), ko.stride(0), ko.stride(1), float(eps), HQ=heads, HK=kv_heads, DH=d,
        DP=triton.next_power_of_2(d), HALF=half, K_OUT=k is not None, num_warps=1 if d <= 128 else 2)
    return q, gate, k, v

