"""One-token GDN decode in two launches per layer: the causal conv and its window slide, the
gates, the q/k L2 norms, the recurrence (state updated in place) and, optionally, the gated
RMSNorm of the output (docs/design.md §8, "The decode step").

A plain decode step is the one-node tree, so the tree kernels compute it exactly, but as
five launches a layer (conv, gates, verify, replay commit, norm) plus the PyTorch glue
between them; production engines run this as one fused recurrent kernel. Here it is two:
the q/k channels first (one program per request and q or k head: conv, norm, the window
slide), then one program per request and value head (its v channels' conv and slide, the
gates, the recurrence, the gated norm). Every conv channel is read and slid by exactly one
program, so none can see a half-written window, and the state work spreads over B x HV
programs (B x H programs, a third as many at 27B, leave most SMs idle at batch 1).

value_split splits each value head's rows over that many programs (B x HV x value_split):
at batch 1 a 9B layer's 32 programs of a whole [128, 128] state each leave most SMs idle and
wait on one 64 KB load. The recurrence needs nothing across value rows; the gated norm needs
the head's sum of squares, so each program writes its rows of o before the norm and its
partial sum, counts itself in on a per-head counter (kernels.skinny_mm's, one buffer a
device), and the last to arrive normalises the head and resets the counter (one launch,
CUDA-graph safe; as for the skinny GEMM, launches sharing the counters run one after another
on one stream, and the counters are reserved before any graph capture: runtime.model does
when the split is on). The launch (split and warps) follows limits.gdn_decode_launch by the
heads a step updates; experiments/component_bench.py times each launch by batch.

Rounding follows the unfused path: the conv output rounds to the activation dtype before
the GDN (as a conv kernel's output would), the recurrence runs in float32, o rounds to
the activation dtype before the gated norm, and the norm's result rounds once more.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.jit_math import softplus, unit_scales
from bole_cli.kernels.skinny_mm import COUNTERS, reserve_counters
from bole_cli.kernels.validate import (ACTIVATION_DTYPES, STATE_DTYPES, check_index_vector, check_last_contiguous,
                                       check_nonempty, check_scale, check_shape, check_tensor, contiguous_vector,
                                       power_of_two)
from bole_cli.limits import gdn_decode_launch, gdn_decode_warps


@triton.jit
def _conv_channels(x_row, win, w, ch, cmask, s_cd, s_cw, s_wd, b_conv,
                   W: tl.constexpr, WP: tl.constexpr, HAS_BIAS: tl.constexpr):
    """SiLU(conv) of channels `ch` over the window and the new input, rounded to the input's
    dtype; also the slid window [BC, WP] (the last W-1 inputs) to store."""
    cols = tl.arange(0, WP)
    wmask = cmask[:, None] & (cols < W - 1)[None, :]
    old = tl.load(win + ch[:, None] * s_cd + cols[None, :] * s_cw, mask=wmask, other=0.0)
    xin = tl.load(x_row + ch, mask=cmask, other=0.0)
    taps = tl.load(w + ch[:, None] * s_wd + cols[None, :], mask=wmask, other=0.0).to(tl.float32)
    last = tl.load(w + ch * s_wd + (W - 1), mask=cmask, other=0.0).to(tl.float32)
    y = tl.sum(old.to(tl.float32) * taps, axis=1) + xin.to(tl.float32) * last
    if HAS_BIAS:
        y += tl.load(b_conv + ch, mask=cmask, other=0.0).to(tl.float32)
    y = y * tl.sigmoid(y)
    y = y.to(xin.dtype).to(tl.float32)
    nxt = tl.load(win + ch[:, None] * s_cd + (cols[None, :] + 1) * s_cw,
                  mask=cmask[:, None] & (cols < W - 2)[None, :], other=0.0)
    slid = tl.where((cols == W - 2)[None, :], xin[:, None].to(old.dtype), nxt)
    return y, slid


@triton.jit(do_not_specialize=["n_slots"])
def _qk_kernel(x, conv_state, conv_w, conv_b, state_idx, qk, n_slots, s_xn, s_cn, s_cd, s_cw, s_wd, scale,
               H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
               HAS_BIAS: tl.constexpr, USE_L2NORM: tl.constexpr):
    """q or k of one key head (program (request, c): q head c for c < H, else k head c - H):
    conv, SiLU, the L2 norm (and q's scale), into qk [B, 2H, K] float32; then the slide of
    those channels' window, which only this program reads."""
    req = tl.program_id(0)
    c = tl.program_id(1)
    slot = tl.load(state_idx + req).to(tl.int64)
    in_pool = (slot >= 0) & (slot < n_slots)
    win = conv_state + tl.where(in_pool, slot, 0) * s_cn
    offs_k = tl.arange(0, BK)
    kmask = offs_k < K
    y, slid = _conv_channels(x + req.to(tl.int64) * s_xn, win, conv_w, c * K + offs_k, kmask, s_cd, s_cw, s_wd,
                             conv_b, W, WP, HAS_BIAS)
    norm = tl.sum(y * y, axis=0)
    inv_k, inv_q = unit_scales(norm, norm, scale, USE_L2NORM)
    y = y * tl.where(c < H, inv_q, inv_k)
    tl.store(qk + (req.to(tl.int64) * 2 * H + c) * K + offs_k, y, mask=kmask)
    tl.debug_barrier()  # every read of the window is done before it slides
    cols = tl.arange(0, WP)
    tl.store(win + (c * K + offs_k)[:, None] * s_cd + cols[None, :] * s_cw, slid,
             mask=(offs_k < tl.where(in_pool, K, 0))[:, None] & (cols < W - 1)[None, :])


@triton.jit(do_not_specialize=["n_slots"])
def _gdn_decode_kernel(
    x, conv_state, conv_w, conv_b, a, b, A_log, dt_bias, state, state_idx, qk, z, norm_w, o, ss_part, counters,
    n_slots, s_xn, s_cn, s_cd, s_cw, s_wd, s_an, s_bn, s_sn, s_sh, s_zn, s_on, eps,
    S_SV: tl.constexpr, H: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, VP: tl.constexpr, VS: tl.constexpr, VSP: tl.constexpr,
    W: tl.constexpr, WP: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
):
    """BV value rows of one value head of one request (program (request, hv, value tile)):
    their v channels' conv and window slide (only this program reads them), the gates, the
    recurrence on those rows of the state in place, o and the gated norm (over the head's
    VS tiles: the last to arrive applies it)."""
    req = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP
    slot = tl.load(state_idx + req).to(tl.int64)
    # A slot outside the pool (no host check): nothing is read or written there, o is NaN.
    in_pool = (slot >= 0) & (slot < n_slots)
    poison = tl.where(in_pool, 0.0, float("nan"))
    safe = tl.where(in_pool, slot, 0)
    win = conv_state + safe * s_cn
    offs_k = tl.arange(0, BK)
    kmask = offs_k < K
    offs_v = iv * BV + tl.arange(0, BV)
    vmask = offs_v < V
    v_write = offs_v < tl.where(in_pool, V, 0)  # the writes' mask: empty outside the pool
    row = qk + req.to(tl.int64) * 2 * H * K
    q = tl.load(row + h * K + offs_k, mask=kmask, other=0.0)
    k = tl.load(row + (H + h) * K + offs_k, mask=kmask, other=0.0)
    v_ch = 2 * H * K + hv * V + offs_v
    v, v_win = _conv_channels(x + req.to(tl.int64) * s_xn, win, conv_w, v_ch, vmask, s_cd, s_cw, s_wd, conv_b,
                              W, WP, HAS_BIAS)
    g = -tl.exp(tl.load(A_log + hv).to(tl.float32)) * softplus(
        tl.load(a + req * s_an + hv).to(tl.float32) + tl.load(dt_bias + hv).to(tl.float32))
    beta = tl.sigmoid(tl.load(b + req * s_bn + hv).to(tl.float32))
    ptr = state + safe * s_sn + hv * s_sh + offs_v[:, None] * S_SV + offs_k[None, :]
    s = tl.load(ptr, mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32) * tl.exp(g)
    u = beta * (v - tl.sum(s * k[None, :], axis=1))
    s = s + u[:, None] * k[None, :]
    out = tl.sum(s * q[None, :], axis=1)
    tl.store(ptr, s.to(state.dtype.element_ty), mask=v_write[:, None] & kmask[None, :])
    tl.debug_barrier()  # every read of this head's window is done before it slides
    cols = tl.arange(0, WP)
    tl.store(win + v_ch[:, None] * s_cd + cols[None, :] * s_cw, v_win, mask=v_write[:, None] & (cols < W - 1)[None, :])
    out = out.to(o.dtype.element_ty).to(tl.float32)
    o_row = o + req * s_on + hv * V
    if NORM and VS > 1:  # the head's rows before the norm, and their sum of squares
        tl.store(o_row + offs_v, out, mask=vmask)
        head = req * tl.num_programs(1) + hv
        tl.store(ss_part + head * VS + iv, tl.sum(out * out, axis=0))
        tl.debug_barrier()  # every thread's rows written before the count (release below)
        arrived = tl.atomic_add(counters + head, 1, sem="acq_rel")
        if arrived == VS - 1:  # the last tile of the head: normalise all of its rows
            offs_h = tl.arange(0, VP)
            hmask = offs_h < V
            tiles = tl.arange(0, VSP)
            # the other programs' writes, past L1 (".cg", as the skinny GEMM's last slice reads)
            var = tl.sum(tl.load(ss_part + head * VS + tiles, mask=tiles < VS, other=0.0, cache_modifier=".cg"),
                         axis=0) / V
            head_o = tl.load(o_row + offs_h, mask=hmask, other=0.0, cache_modifier=".cg").to(tl.float32)
            zz = tl.load(z + req * s_zn + hv * V + offs_h, mask=hmask, other=0.0).to(tl.float32)
            nw = tl.load(norm_w + offs_h, mask=hmask, other=0.0).to(tl.float32)
            tl.store(o_row + offs_h, head_o / tl.sqrt(var + eps) * nw * (zz * tl.sigmoid(zz)) + poison, mask=hmask)
            tl.atomic_xchg(counters + head, 0)
    else:
        if NORM:
            zz = tl.load(z + req * s_zn + hv * V + offs_v, mask=vmask, other=0.0).to(tl.float32)
            nw = tl.load(norm_w + offs_v, mask=vmask, other=0.0).to(tl.float32)
            var = tl.sum(out * out, axis=0) / V
            out = out / tl.sqrt(var + eps) * nw * (zz * tl.sigmoid(zz))
        tl.store(o_row + offs_v, out + poison, mask=vmask)


WHOLE_HEAD = (1, gdn_decode_warps(1))  # (value split, warps): one program a head, no split counters


def gdn_decode(x: torch.Tensor, conv_state: torch.Tensor, conv_w: torch.Tensor, conv_b: Optional[torch.Tensor],
               a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
               state: torch.Tensor, state_indices: torch.Tensor, *, key_heads: int,
               z: Optional[torch.Tensor] = None, norm_w: Optional[torch.Tensor] = None,
               eps: float = 1e-6, scale: Optional[float] = None, use_qk_l2norm: bool = True,
               value_split: Optional[int] = None, num_warps: Optional[int] = None) -> torch.Tensor:
    """One decode token per request, in place on `state` and `conv_state`.

    x [B, D] the conv inputs q|k|v (D = 2 H K + HV V; rows may be strided); conv_state
    [S, D, W-1] (any strides); conv_w [D, W]; conv_b [D] or None; a, b [B, HV] raw gates
    (rows may be strided); A_log, dt_bias [HV]; state [S, HV, V, K] (K contiguous),
    float32 or bfloat16; state_indices [B] pool slots. With z [B, HV V] and norm_w [V]:
    returns the gated RMSNorm rms(o) * norm_w * silu(z) [B, HV V], else o [B, HV V], in
    x's dtype. Slots outside the pool are not touched; their rows of the result are NaN.
    value_split: programs a value head's rows are split over, a power of two leaving at
    least 8 rows to each; num_warps: a program's warps, a power of two up to 16 (defaults:
    limits.gdn_decode_launch of B x HV, its split capped at V / 8, and whole heads past the
    split counters; for another split, limits.gdn_decode_warps). Every refusal comes before
    the first launch.
    """
    check_tensor("x", x, 2, ACTIVATION_DTYPES)
    dev = x.device
    bsz, dim = x.shape
    check_last_contiguous("x", x)
    check_tensor("state", state, 4, STATE_DTYPES, dev)
    n_slots, hv, vdim, kdim = state.shape
    check_nonempty("state", state, {1: "HV (value heads)", 2: "V", 3: "K"})
    check_last_contiguous("state", state)
    if not isinstance(key_heads, int) or key_heads < 1 or hv % key_heads:
        raise InputError(f"key_heads: {key_heads!r} must be a positive divisor of the {hv} value heads")
    if dim != 2 * key_heads * kdim + hv * vdim:
        raise InputError(f"x: {dim} channels, expected 2 * {key_heads} * {kdim} + {hv} * {vdim} (q|k|v)")
    check_tensor("conv_state", conv_state, 3, ACTIVATION_DTYPES, dev)
    if conv_state.shape[:2] != (n_slots, dim):
        raise InputError(f"conv_state: expected shape ({n_slots}, {dim}, W-1), got {tuple(conv_state.shape)}")
    width = conv_state.shape[2] + 1
    if width < 2:
        raise InputError("conv_state: the window must hold at least one input (W >= 2)")
    check_tensor("conv_w", conv_w, 2, ACTIVATION_DTYPES, dev)
    check_shape("conv_w", conv_w, (dim, width))
    check_last_contiguous("conv_w", conv_w)
    if conv_b is not None:
        check_tensor("conv_b", conv_b, 1, ACTIVATION_DTYPES, dev)
        check_shape("conv_b", conv_b, (dim,))
        conv_b = contiguous_vector(conv_b)
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t, 2, ACTIVATION_DTYPES, dev)
        check_shape(name, t, (bsz, hv))
        check_last_contiguous(name, t)
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(name, t, 1, ACTIVATION_DTYPES, dev)
        check_shape(name, t, (hv,))
    A_log, dt_bias = contiguous_vector(A_log), contiguous_vector(dt_bias)
    state_indices = check_index_vector("state_indices", state_indices, bsz, dev)
    if (z is None) != (norm_w is None):
        raise InputError("z and norm_w: give both (the gated norm) or neither")
    if z is not None:
        check_tensor("z", z, 2, ACTIVATION_DTYPES, dev)
        check_shape("z", z, (bsz, hv * vdim))
        check_last_contiguous("z", z)
        check_tensor("norm_w", norm_w, 1, ACTIVATION_DTYPES, dev)
        check_shape("norm_w", norm_w, (vdim,))
        norm_w = contiguous_vector(norm_w)
    scale = check_scale(scale, kdim)
    vp = triton.next_power_of_2(vdim)
    rule_split, rule_warps = gdn_decode_launch(bsz * hv)
    rule_split = min(rule_split, max(1, vp // 8))  # heads of few rows: at least 8 a program
    if z is not None and bsz * hv > COUNTERS:  # more heads than split counters: whole heads
        rule_split, rule_warps = WHOLE_HEAD
    split = rule_split if value_split is None else value_split
    if not power_of_two(split) or vp // split < 8:
        raise InputError(f"value_split: {split!r} must be a power of two leaving at least 8 of the "
                         f"{vdim} value rows to a program")
    if num_warps is None:  # the rule's, or for another split a head's 8 warps spread over it
        warps = rule_warps if split == rule_split else gdn_decode_warps(split)
    else:
        warps = num_warps
    if not power_of_two(warps) or warps > 16:
        raise InputError(f"num_warps: {warps!r} must be a power of two from 1 to 16")
    bv = vp // split
    split = triton.cdiv(vdim, bv)  # tiles that hold rows (V not a power of two)
    normed_split = z is not None and split > 1  # the last tile of a head to arrive normalises it
    if normed_split and bsz * hv > COUNTERS:  # refused before any launch writes a window
        raise InputError(f"value_split: {bsz} x {hv} value heads exceed the {COUNTERS} split counters")
    out = torch.empty(bsz, hv * vdim, device=dev, dtype=x.dtype)
    if bsz:
        qk = torch.empty(bsz, 2 * key_heads, kdim, device=dev, dtype=torch.float32)
        conv = dict(W=width, WP=triton.next_power_of_2(width), HAS_BIAS=conv_b is not None)
        conv_b = conv_b if conv_b is not None else x
        common = (x, conv_state, conv_w, conv_b)
        strides = (x.stride(0), conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), conv_w.stride(0))
        bk = triton.next_power_of_2(kdim)
        _qk_kernel[(bsz, 2 * key_heads)](
            *common, state_indices, qk, n_slots, *strides, scale,
            H=key_heads, K=kdim, BK=bk, USE_L2NORM=bool(use_qk_l2norm), num_warps=4, **conv)
        if normed_split:  # the heads' partial sums of squares and their arrival counters
            ss_part = torch.empty(bsz * hv * split, device=dev, dtype=torch.float32)
            counters = reserve_counters(dev)
        else:
            ss_part = counters = out  # never read
        _gdn_decode_kernel[(bsz, hv, split)](
            *common, a, b, A_log, dt_bias, state, state_indices, qk, z if z is not None else x,
            norm_w if norm_w is not None else x, out, ss_part, counters, n_slots, *strides, a.stride(0), b.stride(0),
            state.stride(0), state.stride(1), z.stride(0) if z is not None else 0, out.stride(0),
            # the state's row stride a constant: fixed offsets from one base, not a 64-bit address a
            # row held from load to store (fewer registers, more programs an SM: experiments/NOTES.md
            # "The state's row stride a constant"); a pool of another stride compiles its own (one
            # value row: any stride reads the same, so one kernel)
            float(eps), S_SV=state.stride(2) if vdim > 1 else kdim, H=key_heads, GROUP=hv // key_heads, K=kdim,
            V=vdim, BK=bk, BV=bv, VP=vp, VS=split, VSP=triton.next_power_of_2(split), NORM=z is not None,
            num_warps=warps, **conv)
    return out
