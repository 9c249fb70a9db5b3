"""y = x @ w.T for a few rows of x (a decode step's batch, a small verify's tree tokens): the
weight streamed once, split along K where the output alone gives too few programs to keep the
memory system busy.

Why: a decode step is its projections' weight reads, and cuBLAS streams some of the decode
shapes at 64-77% of the H200's copy rate (the GDN in_proj, the MLP down projection: split-K
picks, experiments/results/components/h200-9b.json) where the LM head's reaches it. Whether
this kernel beats cuBLAS at a shape is a measurement (experiments/skinny_mm_bench.py); the
runtime takes it only where told to (HybridModel(skinny_mm=...)).

One program owns BN output columns (weight rows) and one of SPLIT slices of K; it loads
weight tiles [BN, BK] along K (all rows of x at once, padded to a power of two of at least 16
for the tensor cores) and accumulates in float32. With SPLIT > 1 each slice writes its partial sums to a float32
workspace and counts itself in on a per-column-block counter; the last slice to arrive adds
the partials, writes y and resets the counter, so a launch leaves the counters as it found
them (one launch, CUDA-graph safe). The counters are one buffer a device: split launches must
run one after another on one stream, as a step's projections do.

The launches around a decode's projections fuse into it: the residual add and the RMSNorm
before a projection (the x rows it streams anyway; each slice sums its squares and the
epilogue scales by 1 / rms, so no pass over the row comes first), and the MLP's SwiGLU after
gate_up (each program owns the gate and the up rows of its columns). That removes the
add + RMSNorm launch before each layer's in_proj and gate_up and the SwiGLU launch between
gate_up and down (docs/design.md §8). Likewise on the heads of x: an attention output's
sigmoid gate before o_proj, and a GDN output's per-head gated RMSNorm before out_proj (a
K tile holds whole heads).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.validate import check_distinct_elements, check_tensor
from bole_cli.limits import SKINNY_MM_MAX_ROWS

COUNTERS = 1 << 16  # column blocks a split launch may have (its counters: 256 KiB a device)
SHARED_BUDGET = 200 * 1024  # a launch's pipelined tiles (an H100/H200 block takes 227 KiB)
_COUNTERS: dict[str, torch.Tensor] = {}  # per device, allocated once, zeros between launches


@triton.jit
def _skinny_mm_kernel(x, w, y, part, counters, res, norm_w, x_sum, ss_part, aux, M, N, K, s_xm, s_wn, s_ym, s_rm,
                      s_sm, s_am, s_ah, k_slice, eps, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      SPLIT: tl.constexpr, IEEE: tl.constexpr, NORM: tl.constexpr, RESID: tl.constexpr,
                      GLU: tl.constexpr, GATE: tl.constexpr, HEAD: tl.constexpr, G: tl.constexpr):
    """N is y's columns; with GLU the weight has 2N rows (gate rows, then up rows). GATE, HEAD:
    aux [M, K / G, G] (heads s_ah apart) is the gate, or z of the per-head norm."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BM).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN).to(tl.int64)
    rk = tl.arange(0, BK)
    m_in = rm < M
    n_in = rn < N
    k0 = pid_k * k_slice
    k1 = tl.minimum(k0 + k_slice, K)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    up = tl.zeros([BM, BN], dtype=tl.float32)  # GLU: the up half's sums
    ss = tl.zeros([BM], dtype=tl.float32)  # NORM: this slice's sum of squares a row
    if NORM or GATE or HEAD:
        # the x-side tiles feed arithmetic before the dot, so the compiler's pipeline (which
        # streams a dot's operands) leaves their loads in line: each is issued a step ahead here
        hw = tl.load(norm_w + rk % G).to(tl.float32) if HEAD else tl.zeros([BK], dtype=tl.float32)
        kc = k0 + rk
        xt_n, rt_n, at_n, nw_n = _x_tiles(x, res, aux, norm_w, rm, kc, m_in, kc < k1, s_xm, s_rm, s_am, s_ah,
                                          BM, BK, RESID, NORM, GATE or HEAD, G)
        for kk in range(k0, k1, BK):
            kc = kk + rk
            k_in = kc < k1
            xt, rt, at, nw = xt_n, rt_n, at_n, nw_n
            xt_n, rt_n, at_n, nw_n = _x_tiles(x, res, aux, norm_w, rm, kc + BK, m_in, (kc + BK) < k1, s_xm, s_rm,
                                              s_am, s_ah, BM, BK, RESID, NORM, GATE or HEAD, G)
            xk = m_in[:, None] & k_in[None, :]
            if RESID:  # the residual add, rounded as the residual stream keeps it
                xt = (xt.to(tl.float32) + rt.to(tl.float32)).to(xt.dtype)
                if pid_n == 0:  # one column block writes the sum for the next layer's add
                    tl.store(x_sum + rm[:, None] * s_sm + kc[None, :], xt, mask=xk)
            if NORM:  # rms(a) * norm_w: norm_w here, the row's 1 / rms on the sums at the end
                xf = xt.to(tl.float32)
                ss += tl.sum(xf * xf, axis=1)
                xt = (xf * nw.to(tl.float32)[None, :]).to(w.dtype.element_ty)
            if GATE:  # an attention output times sigmoid(its gate)
                xt = (xt.to(tl.float32) * tl.sigmoid(at.to(tl.float32))).to(w.dtype.element_ty)
            if HEAD:  # a GDN output: rms(o) * norm_w * silu(z) over each head of G columns
                af = at.to(tl.float32)
                x3 = tl.reshape(xt.to(tl.float32), (BM, BK // G, G))
                r = 1.0 / tl.sqrt(tl.sum(x3 * x3, axis=2) / G + eps)
                xn = tl.reshape(x3 * r[:, :, None], (BM, BK))
                xt = (xn * hw[None, :] * (af * tl.sigmoid(af))).to(w.dtype.element_ty)
            acc, up = _step(acc, up, xt, w, rn, kc, n_in, k_in, s_wn, N, IEEE, GLU)
    else:
        for kk in range(k0, k1, BK):
            kc = kk + rk
            k_in = kc < k1
            xk = m_in[:, None] & k_in[None, :]
            xt = tl.load(x + rm[:, None] * s_xm + kc[None, :], mask=xk, other=0.0)  # (RESID comes with NORM)
            acc, up = _step(acc, up, xt, w, rn, kc, n_in, k_in, s_wn, N, IEEE, GLU)
    out_mask = m_in[:, None] & n_in[None, :]
    y_at = y + rm[:, None] * s_ym + rn[None, :]
    if SPLIT == 1:
        _finish(y_at, acc, up, ss, out_mask, K, eps, NORM, GLU)
    else:
        cols = 2 * N if GLU else N
        slot = part + (pid_k * BM + rm[:, None]) * cols + rn[None, :]
        tl.store(slot, acc, mask=out_mask)
        if GLU:
            tl.store(slot + N, up, mask=out_mask)
        if NORM:
            tl.store(ss_part + (pid_k * tl.num_programs(0) + pid_n) * BM + rm, ss)
        tl.debug_barrier()  # every thread's partials written before the count (release below)
        arrived = tl.atomic_add(counters + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:  # the last slice: add them all, write y, reset the counter
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            up = tl.zeros([BM, BN], dtype=tl.float32)
            ss = tl.zeros([BM], dtype=tl.float32)
            for s in range(SPLIT):
                slot = part + (s * BM + rm[:, None]) * cols + rn[None, :]
                acc += tl.load(slot, mask=out_mask, other=0.0, cache_modifier=".cg")
                if GLU:
                    up += tl.load(slot + N, mask=out_mask, other=0.0, cache_modifier=".cg")
                if NORM:
                    ss += tl.load(ss_part + (s * tl.num_programs(0) + pid_n) * BM + rm, cache_modifier=".cg")
            _finish(y_at, acc, up, ss, out_mask, K, eps, NORM, GLU)
            tl.atomic_xchg(counters + pid_n, 0)


@triton.jit
def _x_tiles(x, res, aux, norm_w, rm, kc, m_in, k_in, s_xm, s_rm, s_am, s_ah, BM: tl.constexpr, BK: tl.constexpr,
             RESID: tl.constexpr, NORM: tl.constexpr, HEADS: tl.constexpr, G: tl.constexpr):
    """One K step's x-side tiles (x, residual, gate or z, norm weight), zeros where absent."""
    xk = m_in[:, None] & k_in[None, :]
    xt = tl.load(x + rm[:, None] * s_xm + kc[None, :], mask=xk, other=0.0)
    rt = tl.zeros([BM, BK], dtype=xt.dtype)
    at = tl.zeros([BM, BK], dtype=xt.dtype)
    nw = tl.zeros([BK], dtype=norm_w.dtype.element_ty)
    if RESID:
        rt = tl.load(res + rm[:, None] * s_rm + kc[None, :], mask=xk, other=0.0)
    if HEADS:
        at = tl.load(aux + rm[:, None] * s_am + ((kc // G) * s_ah + kc % G)[None, :], mask=xk, other=0.0)
    if NORM:
        nw = tl.load(norm_w + kc, mask=k_in, other=0.0)
    return xt, rt, at, nw


@triton.jit
def _step(acc, up, xt, w, rn, kc, n_in, k_in, s_wn, N, IEEE: tl.constexpr, GLU: tl.constexpr):
    """One K step of the product: the weight tile (and the up half's) streamed into the sums."""
    wmask = n_in[:, None] & k_in[None, :]
    wt = tl.load(w + rn[:, None] * s_wn + kc[None, :], mask=wmask, other=0.0)
    if IEEE:
        acc += tl.dot(xt, tl.trans(wt), input_precision="ieee")
    else:
        acc += tl.dot(xt, tl.trans(wt))
    if GLU:
        wu = tl.load(w + (N + rn)[:, None] * s_wn + kc[None, :], mask=wmask, other=0.0)
        if IEEE:
            up += tl.dot(xt, tl.trans(wu), input_precision="ieee")
        else:
            up += tl.dot(xt, tl.trans(wu))
    return acc, up


@triton.jit
def _finish(y_at, acc, up, ss, out_mask, K, eps, NORM: tl.constexpr, GLU: tl.constexpr):
    """The epilogue on the whole sums: the rows' 1 / rms, then silu(gate) * up."""
    if NORM:
        r = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * r[:, None]
        up = up * r[:, None]
    if GLU:
        acc = acc / (1.0 + tl.exp(tl.minimum(-acc, 80.0))) * up  # silu; no overflow far below 0
    tl.store(y_at, acc.to(y_at.dtype.element_ty), mask=out_mask)


def reserve_counters(device) -> torch.Tensor:
    """Allocate the device's split counters now, outside any CUDA graph capture (a capture
    that allocated them would leave their zeroing to its replays)."""
    return _counters(torch.device(device))


def _counters(device: torch.device) -> torch.Tensor:
    """COUNTERS zeroed int32 counters a device, allocated once and never replaced: a captured
    graph holds their address, not the tensor."""
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" are one buffer
        device = torch.device("cuda", torch.cuda.current_device())
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def skinny_mm(x: torch.Tensor, w: torch.Tensor, *, out: Optional[torch.Tensor] = None,
              config: Optional[dict] = None, residual: Optional[torch.Tensor] = None,
              norm: Optional[torch.Tensor] = None, eps: Optional[float] = None,
              sum_out: Optional[torch.Tensor] = None, glu: bool = False, gate: Optional[torch.Tensor] = None,
              head_norm: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (M <= limits.SKINNY_MM_MAX_ROWS; rows may be strided, K contiguous) times w [N,
    K] (a linear layer's weight, K contiguous) transposed: y [M, N] in x's dtype, written into
    `out` when given. config: BN, BK, SPLIT_K (powers of two), num_warps, num_stages; default
    kernels.configs' rule (skinny_mm_launch_config).

    Fused around the product (docs/design.md §8): `residual` [M, K] adds to x first (the sum,
    rounded to x's dtype, written into `sum_out`, which must not overlap x or residual);
    `norm` [K] with `eps` takes the rows' RMSNorm, rms(a) * norm, as the operand (1 / rms
    applied to the sums); `glu` takes w as [2F, K] gate rows then up rows and gives y [M, F] =
    silu(gate) * up. Or, on the heads of x: `gate` [M, H, G] (K = H G; heads may be strided)
    takes x * sigmoid(gate) as the operand (an attention output before o_proj); `head_norm`
    [G] with `z` [M, H, G] and `eps` takes rms(x's head) * head_norm * silu(z) (a GDN output
    before out_proj; G a power of two)."""
    check_tensor("x", x, 2, (torch.bfloat16, torch.float16, torch.float32))
    check_tensor("w", w, 2, (x.dtype,), x.device)
    m, k = x.shape
    if w.shape[1] != k or k < 1:
        raise InputError(f"w: expected [N, {k}] (K as x's, at least 1), got {tuple(w.shape)}")
    if not 1 <= m <= SKINNY_MM_MAX_ROWS:
        raise InputError(f"x: {m} rows; skinny_mm takes 1..{SKINNY_MM_MAX_ROWS} (SKINNY_MM_MAX_ROWS)")
    if glu and w.shape[0] % 2:
        raise InputError(f"w: glu takes gate and up rows, an even count; got {w.shape[0]}")
    n = w.shape[0] // 2 if glu else w.shape[0]
    for name, t in (("x", x), ("w", w)):
        if t.stride(1) != 1:
            raise InputError(f"{name}: the last dimension (K) must be contiguous")
    _check_prologue(x, residual, norm, eps, sum_out)
    aux, group = _check_heads(x, gate, head_norm, z, eps, norm is not None)
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        check_tensor("out", out, 2, (x.dtype,), x.device)
        if tuple(out.shape) != (m, n) or out.stride(1) != 1:
            raise InputError(f"out: expected [{m}, {n}] with contiguous columns, got {tuple(out.shape)}")
        check_distinct_elements("out", out)
        for name, t in (("x", x), ("w", w), ("residual", residual), ("sum_out", sum_out), ("gate", gate),
                        ("z", z)):
            if t is not None and out.numel() and t.numel() and _overlap(out, t):
                raise InputError(f"out: overlaps {name}, which the product reads or writes")
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
    cfg = launch_config("skinny_mm", {"M": m, "N": w.shape[0], "K": k, "SMS": sms}, config)
    if n == 0 and residual is None:
        return out
    bn, bk, split = cfg["BN"], cfg["BK"], cfg["SPLIT_K"]
    if glu:  # BN weight rows a program: half gate, half up (16 columns each at least)
        bn = max(16, bn // 2)
    if head_norm is not None:  # a K tile holds whole heads
        bk = max(bk, group)
    bm = max(16, triton.next_power_of_2(m))  # x's rows padded for the tensor cores' tiles
    blocks = max(1, triton.cdiv(n, bn))  # one block at least: it writes sum_out
    k_slice = triton.cdiv(triton.cdiv(k, split), bk) * bk  # whole BK tiles a slice
    split = max(1, triton.cdiv(k, k_slice)) if k else 1
    part = counters = ss_part = out  # never read unless split
    if split > 1:
        if blocks > COUNTERS:
            raise InputError(f"config: {blocks} column blocks of BN={bn} split along K; a split launch "
                             f"counts at most {COUNTERS} (a larger BN, or SPLIT_K 1)")
        part = torch.empty(split * bm, 2 * n if glu else n, dtype=torch.float32, device=x.device)
        counters = _counters(x.device)
        if norm is not None:
            ss_part = torch.empty(split * blocks * bm, dtype=torch.float32, device=x.device)
    resid = residual if residual is not None else x
    total = sum_out if sum_out is not None else x
    weight = norm if norm is not None else head_norm if head_norm is not None else x
    heads = aux if aux is not None else x.view(m, 1, k)
    _skinny_mm_kernel[(blocks, split)](
        x, w, out, part, counters, resid, weight, total, ss_part, heads, m, n, k, x.stride(0),
        w.stride(0), out.stride(0), resid.stride(0), total.stride(0), heads.stride(0), heads.stride(1), k_slice,
        float(eps or 0.0), BM=bm, BN=bn, BK=bk, SPLIT=split, IEEE=x.dtype == torch.float32, NORM=norm is not None,
        RESID=residual is not None, GLU=bool(glu), GATE=gate is not None, HEAD=head_norm is not None, G=group,
        num_warps=cfg["num_warps"], num_stages=_stages(cfg["num_stages"], bm, bn * (2 if glu else 1), bk,
                                                       x.element_size(), 1 + (residual is not None) + (aux is not None)))
    return out


def _stages(asked: int, bm: int, bn: int, bk: int, elem: int, row_tiles: int) -> int:
    """Pipeline stages that fit SHARED_BUDGET: each keeps the x-side tiles (x, and the residual
    or the gate / z the operand reads) and the weight tile of one K step in shared memory."""
    per_stage = (row_tiles * bm + bn) * bk * elem
    return max(1, min(asked, SHARED_BUDGET // per_stage))


def _check_heads(x, gate, head_norm, z, eps, row_norm: bool):
    """The per-head operand's arguments -> (aux [M, H, G] or None, G)."""
    m, k = x.shape
    if gate is None and head_norm is None:
        if z is not None:
            raise InputError("z: only with head_norm (silu(z) gates the normed heads)")
        return None, 1
    if row_norm or (gate is not None and head_norm is not None):
        raise InputError("gate, head_norm: one operand transform at a time (and not with norm)")
    if head_norm is not None:
        check_tensor("head_norm", head_norm, 1, (torch.bfloat16, torch.float16, torch.float32), x.device)
        g = head_norm.shape[0]
        if g < 1 or g & (g - 1) or head_norm.stride(0) != 1:
            raise InputError(f"head_norm: expected [G] contiguous, G a power of two, got {tuple(head_norm.shape)}")
        if eps is None or not eps > 0:  # a head padded past K has no squares: 1 / sqrt(eps) must be finite
            raise InputError(f"eps: the norm's epsilon, above 0, required with head_norm; got {eps!r}")
        if z is None:
            raise InputError("z: required with head_norm (silu(z) gates the normed heads)")
        name, aux = "z", z
    else:
        if z is not None:
            raise InputError("z: only with head_norm (silu(z) gates the normed heads)")
        name, aux = "gate", gate
    check_tensor(name, aux, 3, (x.dtype,), x.device)
    g = aux.shape[2]
    if aux.shape[0] != m or aux.shape[1] * g != k or aux.stride(2) != 1 or (
            head_norm is not None and g != head_norm.shape[0]):
        raise InputError(f"{name}: expected [{m}, H, G] with H G = {k} (K), G contiguous"
                         + (f" and G = {head_norm.shape[0]} (head_norm's)" if head_norm is not None else "")
                         + f"; got {tuple(aux.shape)}")
    return aux, g


def _check_prologue(x, residual, norm, eps, sum_out) -> None:
    """The fused add and norm's arguments: shapes as x's, contiguous K, sum_out apart from
    the inputs the other programs still read."""
    m, k = x.shape
    if residual is not None:
        check_tensor("residual", residual, 2, (x.dtype,), x.device)
        if sum_out is None:
            raise InputError("sum_out: required with residual (the sum the next layer adds to)")
        check_tensor("sum_out", sum_out, 2, (x.dtype,), x.device)
        for name, t in (("residual", residual), ("sum_out", sum_out)):
            if tuple(t.shape) != (m, k) or t.stride(1) != 1:
                raise InputError(f"{name}: expected [{m}, {k}] like x with contiguous columns, got {tuple(t.shape)}")
        for name, t in (("x", x), ("residual", residual)):
            if _overlap(sum_out, t):
                raise InputError(f"sum_out: overlaps {name}, which other programs read while it is written")
    elif sum_out is not None:
        raise InputError("sum_out: only with residual (it receives x + residual)")
    if norm is not None:
        if x.dtype == torch.float16:  # a * norm_w rounds to the operand before 1 / rms: fp16 overflows
            raise InputError("norm: not with float16 x (its range is too small for the unscaled rows); "
                             "use bfloat16 or float32")
        check_tensor("norm", norm, 1, (torch.bfloat16, torch.float16, torch.float32), x.device)
        if norm.shape[0] != k or norm.stride(0) != 1:
            raise InputError(f"norm: expected [{k}] contiguous (x's K), got {tuple(norm.shape)}")
        if eps is None or not eps >= 0:
            raise InputError(f"eps: the norm's epsilon, at least 0, required with norm; got {eps!r}")
    elif residual is not None:
        raise InputError("residual: only with norm (the fused add feeds the RMSNorm)")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory spans intersect (a conservative test on their extents)."""
    def span(t):
        lo = t.data_ptr()
        return lo, lo + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a.device == b.device and a0 < b1 and b0 < a1
