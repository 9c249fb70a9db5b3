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
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.configs import launch_config
from bole_cli.kernels.validate import check_tensor
from bole_cli.limits import SKINNY_MM_MAX_ROWS

COUNTERS = 1 << 16  # column blocks a split launch may have (its counters: 256 KiB a device)
_COUNTERS: dict[str, torch.Tensor] = {}  # per device, allocated once, zeros between launches


@triton.jit
def _skinny_mm_kernel(x, w, y, part, counters, M, N, K, s_xm, s_wn, s_ym, k_slice,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                      IEEE: tl.constexpr):
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
    for kk in range(k0, k1, BK):
        k_in = (kk + rk) < k1
        xt = tl.load(x + rm[:, None] * s_xm + (kk + rk)[None, :], mask=m_in[:, None] & k_in[None, :], other=0.0)
        wt = tl.load(w + rn[:, None] * s_wn + (kk + rk)[None, :], mask=n_in[:, None] & k_in[None, :],
                     other=0.0)
        if IEEE:
            acc += tl.dot(xt, tl.trans(wt), input_precision="ieee")
        else:
            acc += tl.dot(xt, tl.trans(wt))
    out_mask = m_in[:, None] & n_in[None, :]
    if SPLIT == 1:
        tl.store(y + rm[:, None] * s_ym + rn[None, :], acc.to(y.dtype.element_ty), mask=out_mask)
    else:
        slot = part + (pid_k * BM + rm[:, None]) * N + rn[None, :]
        tl.store(slot, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partials written before the count (release below)
        arrived = tl.atomic_add(counters + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:  # the last slice: add them all, write y, reset the counter
            total = tl.zeros([BM, BN], dtype=tl.float32)
            for s in range(SPLIT):
                total += tl.load(part + (s * BM + rm[:, None]) * N + rn[None, :], mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            tl.store(y + rm[:, None] * s_ym + rn[None, :], total.to(y.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(counters + pid_n, 0)


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
              config: Optional[dict] = None) -> torch.Tensor:
    """x [M, K] (M <= limits.SKINNY_MM_MAX_ROWS; rows may be strided, K contiguous) times w [N,
    K] (a linear layer's weight, K contiguous) transposed: y [M, N] in x's dtype, written into
    `out` when given. config: BN, BK, SPLIT_K (powers of two), num_warps, num_stages; default
    kernels.configs' rule (skinny_mm_launch_config)."""
    check_tensor("x", x, 2, (torch.bfloat16, torch.float16, torch.float32))
    check_tensor("w", w, 2, (x.dtype,), x.device)
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or k < 1:
        raise InputError(f"w: expected [N, {k}] (K as x's, at least 1), got {tuple(w.shape)}")
    if not 1 <= m <= SKINNY_MM_MAX_ROWS:
        raise InputError(f"x: {m} rows; skinny_mm takes 1..{SKINNY_MM_MAX_ROWS} (SKINNY_MM_MAX_ROWS)")
    for name, t in (("x", x), ("w", w)):
        if t.stride(1) != 1:
            raise InputError(f"{name}: the last dimension (K) must be contiguous")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        check_tensor("out", out, 2, (x.dtype,), x.device)
        if tuple(out.shape) != (m, n) or out.stride(1) != 1:
            raise InputError(f"out: expected [{m}, {n}] with contiguous columns, got {tuple(out.shape)}")
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
    cfg = launch_config("skinny_mm", {"M": m, "N": n, "K": k, "SMS": sms}, config)
    if n == 0:
        return out
    bn, bk, split = cfg["BN"], cfg["BK"], cfg["SPLIT_K"]
    bm = max(16, triton.next_power_of_2(m))  # x's rows padded for the tensor cores' tiles
    blocks = triton.cdiv(n, bn)
    k_slice = triton.cdiv(triton.cdiv(k, split), bk) * bk  # whole BK tiles a slice
    split = max(1, triton.cdiv(k, k_slice)) if k else 1
    if split > 1:
        if blocks > COUNTERS:
            raise InputError(f"config: {blocks} column blocks of BN={bn} split along K; a split launch "
                             f"counts at most {COUNTERS} (a larger BN, or SPLIT_K 1)")
        part = torch.empty(split * bm, n, dtype=torch.float32, device=x.device)
        counters = _counters(x.device)
    else:
        part = counters = out  # never read
    _skinny_mm_kernel[(blocks, split)](
        x, w, out, part, counters, m, n, k, x.stride(0), w.stride(0), out.stride(0), k_slice,
        BM=bm, BN=bn, BK=bk, SPLIT=split, IEEE=x.dtype == torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out
