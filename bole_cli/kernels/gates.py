"""GDN gate preparation, elementwise over all nodes: g = -exp(A_log) softplus(a + dt_bias),
beta = sigmoid(b). Tree-parallel by construction (no node depends on another)."""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.jit_math import softplus
from bole_cli.kernels.validate import ACTIVATION_DTYPES, check_nonempty, check_shape, check_tensor, contiguous_vector


@triton.jit
def _gdn_gates_kernel(A_log, a, dt_bias, b, g, beta, n, s_an, s_bn,
                      HV: tl.constexpr, BN: tl.constexpr, HP: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    heads = tl.arange(0, HP)
    mask = (rows < n)[:, None] & (heads < HV)[None, :]
    x = tl.load(a + rows[:, None] * s_an + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    x += tl.load(dt_bias + heads, mask=heads < HV, other=0.0).to(tl.float32)[None, :]
    sp = softplus(x)
    decay = -tl.exp(tl.load(A_log + heads, mask=heads < HV, other=0.0).to(tl.float32))
    bb = tl.load(b + rows[:, None] * s_bn + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    out = rows[:, None] * HV + heads[None, :]
    tl.store(g + out, decay[None, :] * sp, mask=mask)
    tl.store(beta + out, tl.sigmoid(bb), mask=mask)


def gdn_gates(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
              *, out: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [N, HV] (rows may be strided); A_log, dt_bias [HV]. Returns float32 (g, beta) [N, HV],
    written into `out` (two contiguous float32 [N, HV] tensors, e.g. a replay commit's rows)
    when given."""
    check_tensor("a", a, 2, ACTIVATION_DTYPES)
    dev = a.device
    n, hv = a.shape
    check_nonempty("a", a, {1: "HV (value heads)"})
    check_tensor("b", b, 2, ACTIVATION_DTYPES, dev)
    check_shape("b", b, (n, hv))
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(name, t, 1, ACTIVATION_DTYPES, dev)
        check_shape(name, t, (hv,))
    A_log, dt_bias = contiguous_vector(A_log), contiguous_vector(dt_bias)  # read as raw memory
    for name, t in (("a", a), ("b", b)):
        if t.numel() and t.stride(-1) != 1:
            raise InputError(f"{name}: the head dimension must be contiguous")
    if out is None:
        g = torch.empty(n, hv, device=dev, dtype=torch.float32)
        beta = torch.empty_like(g)
    else:
        g, beta = out
        for name, t in (("out[0]", g), ("out[1]", beta)):
            check_tensor(name, t, 2, (torch.float32,), dev)
            check_shape(name, t, (n, hv))
            if not t.is_contiguous():
                raise InputError(f"{name}: must be contiguous")
    if n:
        hp = triton.next_power_of_2(hv)
        bn = max(1, min(64, 4096 // hp))
        _gdn_gates_kernel[(triton.cdiv(n, bn),)](
            A_log, a, dt_bias, b, g, beta, n, a.stride(0), b.stride(0),
            HV=hv, BN=bn, HP=hp,
        )
    return g, beta
