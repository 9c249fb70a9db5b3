"""Mixture-of-experts MLP: top-k softmax routing, sort-based dispatch, grouped matmul.

Tokens are sorted by expert so each expert's rows are contiguous; `torch._grouped_mm`
runs all experts in one call from device-side offsets (no host sync, so it can be
captured in a CUDA graph). Where it is unavailable for the device/dtype (e.g. float64),
a loop over the experts that received tokens does the same work (host-synchronising).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from bole_cli.runtime.fusion import swiglu


@functools.lru_cache(maxsize=None)
def grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Probe torch._grouped_mm once per (device, dtype), with uneven and empty groups."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        x = torch.ones(5, 16, device=device_type, dtype=dtype)
        w = torch.ones(3, 8, 16, device=device_type, dtype=dtype)
        offs = torch.tensor([2, 2, 5], device=device_type, dtype=torch.int32)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        return tuple(y.shape) == (5, 8) and bool((y == 16).all())
    except Exception:  # noqa: BLE001 - any failure means "use the loop"
        return False


def expert_matmul(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *, grouped: bool) -> torch.Tensor:
    """Rows offs[e-1]:offs[e] of x times w[e]^T. x [M, in]; w [E, out, in]; offs [E] int32 ends."""
    if grouped:
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    out = x.new_empty(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ w[e].t()
        start = end
    return out


def route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, top-k, renormalised (Qwen3 norm_topk_prob). -> weights, ids [N, k]."""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    probs = torch.softmax(F.linear(x, router).to(cdt), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def moe_forward(x: torch.Tensor, router: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                top_k: int, *, grouped: Optional[bool] = None) -> torch.Tensor:
    """Routed experts only. x [N, hidden]; router [E, hidden]; w13 [E, 2F, hidden]; w2 [E, hidden, F]."""
    n, hidden = x.shape
    n_exp = router.shape[0]
    if grouped is None:
        grouped = grouped_mm_works(x.device.type, x.dtype)
    weights, ids = route(x, router, top_k)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    xs = x.index_select(0, order // top_k)
    counts = torch.zeros(n_exp, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    h = swiglu(expert_matmul(xs, w13, offs, grouped=grouped))
    ys = expert_matmul(h, w2, offs, grouped=grouped)
    y = torch.empty_like(ys).index_copy_(0, order, ys)  # back to (token, k) order, no atomics
    return (y.view(n, top_k, hidden) * weights.to(y.dtype).unsqueeze(-1)).sum(1)


def moe_naive(x: torch.Tensor, router: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              top_k: int) -> torch.Tensor:
    """Token by token, expert by expert: the definition moe_forward must equal (tests)."""
    weights, ids = route(x, router, top_k)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(top_k):
            e = int(ids[t, j])
            out[t] += weights[t, j].to(x.dtype) * (swiglu(x[t] @ w13[e].t()) @ w2[e].t())
    return out
