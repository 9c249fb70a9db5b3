"""The kernels' result and argument types (docs/design.md §3): what tree_verify returns, and
the arguments its kernels share, by name."""

from __future__ import annotations

from typing import NamedTuple

import torch


class VerifyResult(NamedTuple):
    """Outputs of a tree verify: o [N, HV, V], the factors u [N, HV, V] and log_p [N, HV]."""

    o: torch.Tensor
    u: torch.Tensor
    log_p: torch.Tensor

    @classmethod
    def like(cls, v: torch.Tensor) -> "VerifyResult":
        """Uninitialised outputs for a verify of v [N, HV, V]: o like v, u and log_p float32."""
        return cls(torch.empty_like(v), torch.empty(v.shape, dtype=torch.float32, device=v.device),
                   torch.empty(v.shape[:2], dtype=torch.float32, device=v.device))


class DraftRows(NamedTuple):
    """A GDN layer's per-node inputs as the gated verify takes them: q, k [N, H, K], v [N, HV,
    V], a, b [N, HV] (the deferred write's segments and drafts, kernels/pending_chain.py)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


class VerifyArgs(NamedTuple):
    """The leading arguments of the verify kernels (one-tile, blocked, levels), in their
    order: `kernel[grid](*args, ...)` passes them all, and each launcher reads what its other
    kernels take by name. g/beta are a/b and A_log/dt_bias the gate parameters when the
    gates are fused (else g again: never read); the strides are the tensors' own. The
    one-tile kernel takes n_hv with the rest and does not read it."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    state: torch.Tensor
    state_idx: torch.Tensor
    parents: torch.Tensor
    cu: torch.Tensor
    o: torch.Tensor
    u: torch.Tensor
    log_p: torch.Tensor
    scale: float
    n_slots: int
    n_rows: int
    n_hv: int
    s_qn: int
    s_qh: int
    s_kn: int
    s_kh: int
    s_vn: int
    s_vh: int
    s_gn: int
    s_gh: int
    s_bn: int
    s_bh: int
    s_sn: int
    s_sh: int
    s_sv: int
    s_on: int
    s_oh: int
    s_un: int
    s_uh: int
    s_ln: int


def verify_args(q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, log_p,
                scale: float) -> VerifyArgs:
    """VerifyArgs of checked tensors, strides read off them."""
    return VerifyArgs(q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, log_p,
                      scale, state.shape[0], q.shape[0], v.shape[1],
                      q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                      g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
                      state.stride(0), state.stride(1), state.stride(2),
                      o.stride(0), o.stride(1), u.stride(0), u.stride(1), log_p.stride(0))
