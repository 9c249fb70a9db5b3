"""The runtime's one door to the GDN tree kernels (docs/design.md §3), plus the two one-token
ops of a plain decode step.

`GDNOps` calls `bole_cli.kernels` (Triton) where it has the function, and otherwise the
float64 references in `bole_cli.kernels.reference` (same argument order; their commits
return new tensors, so they are copied back here to keep the in-place contract). It also
owns everything that depends on the conv-window layout: the rest of the runtime only
calls `conv_state_shape`, `conv_decode` and the tree ops.

Precision contract of this adapter (what the model relies on):
- o comes back in v's dtype, y (conv) in x's dtype;
- g, beta, u and log_p come back in `factor_dtype(activation dtype)`: float32, or
  float64 when the activations are float64 (the reference path's exact CPU tests).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from bole_cli.errors import InputError
from bole_cli.kernels import reference as ref

OPS = ("gdn_decode", "gdn_gates", "tree_verify", "tree_verify_gated", "tree_commit_replay",
       "tree_commit_replay_gated", "tree_conv", "tree_conv_commit")
BACKENDS = ("auto", "kernels", "reference")


# ---- layouts ----------------------------------------------------------------------------

def conv_state_shape(slots: int, channels: int, width: int) -> tuple[int, int, int]:
    """Conv windows: [slots, channels, width-1], the last width-1 inputs, oldest first."""
    return (slots, channels, width - 1)


def factor_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- one-token ops (plain decode) -------------------------------------------------------

def conv_decode(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor], state_indices: torch.Tensor,
                *, activation: bool = True) -> torch.Tensor:
    """One new input per request: y = act(bias + sum_w weight[:, w] * window[w]) over the
    committed window plus x, then slide the window (in place). x [B, D] -> y [B, D]."""
    cdt = factor_dtype(x.dtype)
    window = conv_state.index_select(0, state_indices)  # [B, D, W-1]
    full = torch.cat([window, x.unsqueeze(-1).to(window.dtype)], dim=-1)  # [B, D, W]
    conv_state.index_copy_(0, state_indices, full[..., 1:])
    y = (full.to(cdt) * weight.to(cdt)).sum(-1)
    if bias is not None:
        y = y + bias.to(cdt)
    return (F.silu(y) if activation else y).to(x.dtype)


def recurrent_step(q, k, v, g, beta, state: torch.Tensor, state_indices: torch.Tensor,
                   *, scale: Optional[float] = None, use_qk_l2norm: bool = True) -> torch.Tensor:
    """The GDN one-token recurrence for B requests, updating state[state_indices] in place.

    q, k [B, H, K]; v [B, HV, V]; g, beta [B, HV]; state [S, HV, V, K]. Returns o [B, HV, V]
    in v's dtype. S <- exp(g) S; u = beta (v - S k); S <- S + u k^T; o = S q.
    """
    cdt = state.dtype if state.dtype == torch.float64 else torch.float32
    hv = v.shape[1]
    q, k = q.to(cdt), k.to(cdt)
    if use_qk_l2norm:
        q, k = ref.l2norm(q), ref.l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    group = hv // k.shape[1]
    q = q.repeat_interleave(group, dim=1)  # [B, HV, K]
    k = k.repeat_interleave(group, dim=1)
    s = state.index_select(0, state_indices).to(cdt)  # [B, HV, V, K]
    s.mul_(torch.exp(g.to(cdt))[..., None, None])
    pred = (s @ k.unsqueeze(-1)).squeeze(-1)  # [B, HV, V]
    u = beta.to(cdt).unsqueeze(-1) * (v.to(cdt) - pred)
    s.addcmul_(u.unsqueeze(-1), k.unsqueeze(-2))
    o = (s @ q.unsqueeze(-1)).squeeze(-1)
    state.index_copy_(0, state_indices, s.to(state.dtype))
    return o.to(v.dtype)


# ---- tree ops ---------------------------------------------------------------------------

def _load_kernels() -> dict:
    try:
        import bole_cli.kernels as kernels
    except Exception:  # noqa: BLE001 - a kernel module mid-development must not break the runtime
        return {}
    return {name: getattr(kernels, name) for name in OPS if callable(getattr(kernels, name, None))}


class GDNOps:
    """Tree-parallel GDN ops through the kernel API, with a per-function reference fallback.

    backend: "kernels" (Triton wherever bole_cli.kernels has the function), "reference"
    (float64 PyTorch; exact, slow, host-synchronising) or "auto" (kernels on CUDA, the
    reference on CPU, where Triton only runs interpreted). `describe()` says which each op uses.
    """

    def __init__(self, backend: str = "auto", device: torch.device | str = "cpu"):
        if backend not in BACKENDS:
            raise InputError(f"gdn backend {backend!r}: expected one of {', '.join(BACKENDS)}")
        device = torch.device(device)
        if backend == "auto":
            backend = "kernels" if device.type == "cuda" else "reference"
        self.backend = backend
        self._k = _load_kernels() if backend == "kernels" else {}

    def uses_kernel(self, op: str) -> bool:
        return op in self._k

    def describe(self) -> dict:
        return {op: ("triton" if op in self._k else "reference") for op in OPS}

    def decode(self, x, conv_state, conv_w, conv_b, a, b, A_log, dt_bias, state, state_indices, *,
               key_heads: int, z, norm_w, eps: float, value_split: Optional[int] = None,
               num_warps: Optional[int] = None) -> torch.Tensor:
        """One decode token per request, conv to gated norm, in one fused kernel (in place on
        the state and the conv windows); returns rms(o) * norm_w * silu(z) [B, HV V] in x's
        dtype, what out_proj reads. value_split, num_warps: the kernel's launch (default its
        rule's)."""
        args = (x, conv_state, conv_w, conv_b, a, b, A_log, dt_bias, state, state_indices)
        kw = dict(key_heads=key_heads, z=z, norm_w=norm_w, eps=eps)
        if "gdn_decode" in self._k and factor_dtype(x.dtype) == torch.float32:
            return self._k["gdn_decode"](*args, **kw, value_split=value_split, num_warps=num_warps)
        out, new_state, new_conv = ref.gdn_decode_ref(*args, **kw)
        state.copy_(new_state)
        conv_state.copy_(new_conv)
        return out.to(x.dtype)

    def gates(self, A_log, a, dt_bias, b, out: Optional[tuple] = None):
        """(g, beta) [N, HV] = (-exp(A_log) softplus(a + dt_bias), sigmoid(b)), into `out`
        (two [N, HV] tensors of the factor dtype) when given."""
        fdt = factor_dtype(a.dtype)
        if "gdn_gates" in self._k and fdt == torch.float32:
            return self._k["gdn_gates"](A_log, a, dt_bias, b, out=out)
        g, beta = ref.gdn_gates_ref(A_log, a, dt_bias, b)
        if out is None:
            return g.to(fdt), beta.to(fdt)
        out[0].copy_(g)
        out[1].copy_(beta)
        return out

    def verify(self, q, k, v, g, beta, state, state_indices, parents, cu_seqlens,
               *, out: Optional[ref.VerifyResult] = None, max_nodes: Optional[int] = None,
               max_depth: Optional[int] = None) -> ref.VerifyResult:
        """Theorem 1 over the packed forest; `out` (o, u, log_p) receives the results: o
        always, u and log_p only where a kernel writes them (the runtime's commit is the
        replay, which reads neither: the one-tile kernel skips them, tree_verify's
        factors=False). max_nodes, max_depth: the largest tree and the most strict ancestors
        of a node, if known (they pick the kernel: one tile, or the fast big-tree kernel alone)."""
        if "tree_verify" in self._k:
            return self._k["tree_verify"](q, k, v, g, beta, state, state_indices, parents, cu_seqlens,
                                          check_trees=False, max_nodes=max_nodes, max_depth=max_depth, out=out,
                                          factors=False)
        o, u, log_p = ref.tree_verify_ref(q, k, v, g, beta, state, state_indices, parents, cu_seqlens)
        fdt = factor_dtype(v.dtype)
        if out is None:
            return ref.VerifyResult(o.to(v.dtype), u.to(fdt), log_p.to(fdt))
        out.o.copy_(o)
        out.u.copy_(u)
        out.log_p.copy_(log_p)
        return out

    def verify_gated(self, q, k, v, a, b, A_log, dt_bias, state, state_indices, parents, cu_seqlens,
                     *, out: Optional[ref.VerifyResult] = None, max_nodes: Optional[int] = None,
                     max_depth: Optional[int] = None) -> ref.VerifyResult:
        """verify with the gates computed inside the kernel from the raw a, b [N, HV] (views of
        the in_proj output will do): one launch a layer fewer than gates + verify, and no g,
        beta rows in memory (docs/design.md §9)."""
        if "tree_verify_gated" in self._k and factor_dtype(v.dtype) == torch.float32:
            return self._k["tree_verify_gated"](q, k, v, a, b, A_log, dt_bias, state, state_indices, parents,
                                                cu_seqlens, check_trees=False, max_nodes=max_nodes,
                                                max_depth=max_depth, out=out, factors=False)
        g, beta = self.gates(A_log, a, dt_bias, b)
        return self.verify(q, k, v, g, beta, state, state_indices, parents, cu_seqlens, out=out,
                           max_nodes=max_nodes, max_depth=max_depth)

    def commit_replay(self, state, state_indices, k, v, g, beta, parents, cu_seqlens, accepted, *,
                      max_nodes: Optional[int] = None, max_depth: Optional[int] = None) -> None:
        """The served commit (docs/design.md §9): each accepted path replayed in float32 from
        the pre-tree state; a leading layer dim on state/k/v/g/beta commits every layer at once.
        max_nodes, max_depth: the verify's promises (they choose the kernels, as there)."""
        if "tree_commit_replay" in self._k:
            self._k["tree_commit_replay"](state, state_indices, k, v, g, beta, parents, cu_seqlens, accepted,
                                          check_trees=False, max_nodes=max_nodes, max_depth=max_depth)
            return
        state.copy_(ref.tree_commit_replay_ref(state, state_indices, k, v, g, beta, parents, cu_seqlens, accepted))

    def commit_replay_gated(self, state, state_indices, k, v, a, b, A_log, dt_bias, parents, cu_seqlens,
                            accepted, *, max_nodes: Optional[int] = None,
                            max_depth: Optional[int] = None) -> None:
        """commit_replay from the raw a, b, as verify_gated takes them; with a leading layer
        dim, A_log and dt_bias are [L, HV] (one row a layer)."""
        if "tree_commit_replay_gated" in self._k and factor_dtype(v.dtype) == torch.float32:
            self._k["tree_commit_replay_gated"](state, state_indices, k, v, a, b, A_log, dt_bias, parents,
                                                cu_seqlens, accepted, check_trees=False, max_nodes=max_nodes,
                                                max_depth=max_depth)
            return
        rows = (lambda t: t.unsqueeze(-2)) if A_log.dim() > 1 else (lambda t: t)  # [L, 1, HV] over [L, N, HV]
        g, beta = ref.gdn_gates_ref(rows(A_log), a, rows(dt_bias), b)
        fdt = factor_dtype(v.dtype)
        self.commit_replay(state, state_indices, k, v, g.to(fdt), beta.to(fdt), parents, cu_seqlens, accepted,
                           max_nodes=max_nodes, max_depth=max_depth)

    def conv(self, x, conv_state, weight, bias, state_indices, parents, cu_seqlens,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """SiLU(depthwise causal conv) along each node's ancestor chain; y [N, D] in x's dtype
        (written into `out` when given)."""
        if "tree_conv" in self._k:
            return self._k["tree_conv"](x, conv_state, weight, bias, state_indices, parents,
                                        cu_seqlens, activation=True, check_trees=False, out=out)
        y = ref.tree_conv_ref(x, conv_state, weight, bias, state_indices, parents, cu_seqlens, activation=True)
        return y.to(x.dtype) if out is None else out.copy_(y)

    def conv_commit(self, conv_state, x, state_indices, parents, cu_seqlens, accepted) -> None:
        """Windows <- the last W-1 inputs on the path to each accepted node (in place)."""
        if "tree_conv_commit" in self._k:
            self._k["tree_conv_commit"](conv_state, x, state_indices, parents, cu_seqlens,
                                        accepted, check_trees=False)
            return
        conv_state.copy_(ref.tree_conv_commit_ref(conv_state, x, state_indices, parents, cu_seqlens, accepted))
