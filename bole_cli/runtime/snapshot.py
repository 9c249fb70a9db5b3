"""The snapshot-baseline GDN tree verify: what today's engines do (docs/design.md §1, §6).

Node by node (T serial steps per layer), every node's full state is written to a
snapshot buffer; after sampling, the accepted node's snapshot is copied back into the
state pool. Memory traffic is the baseline's: B*T*HV*V*K state elements written per
layer, a [L, B, T(+1), HV, V, K] buffer alive during the verify.

Two engines share the buffer layout [L, B, T+1, HV, V, K] (row 0 of each request holds
its committed state S_pre, row t+1 node t's snapshot), so the copy-back is one gather:
- "torch": a PyTorch step loop (parents gathered from the buffer, so trees of any shape,
  several roots included). Faithful in what it stores, not a fused kernel.
- "sglang": SGLang 0.5.23's own `fused_sigmoid_gating_delta_rule_update` (the serial
  verifier SGLang runs for target_verify), loaded by bole_cli.sglang.baseline_kernels. It writes
  node t to row t+1 because the kernel takes the per-request pitch from the buffer's
  stride(0). Single-root trees only (node 0 the root), as in SGLang.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from bole_cli.errors import BoleError, InputError
from bole_cli.kernels.reference import l2norm


def load_sglang_gdn(source: Any = None) -> Any:
    """SGLang's kernels (an object with fused_sigmoid_gating_delta_rule_update) via
    bole_cli.sglang.baseline_kernels.load_sglang_kernels; `source` is passed through (a wheel or site dir)."""
    try:
        from bole_cli.sglang.baseline_kernels import load_sglang_kernels
    except ImportError as exc:  # pragma: no cover - the loader ships with the package
        raise BoleError(f"SGLang kernel loader unavailable: {exc}") from exc
    return load_sglang_kernels(source)


def _sglang_fn(kernels: Any):
    fn = getattr(kernels, "fused_sigmoid_gating_delta_rule_update", None)
    if fn is None and isinstance(kernels, dict):
        fn = kernels.get("fused_sigmoid_gating_delta_rule_update")
    if fn is None:
        raise BoleError("the SGLang kernels object has no fused_sigmoid_gating_delta_rule_update")
    return fn


class SnapshotGDN:
    """Baseline tree verify and copy-back. `kernels`: None for the PyTorch step loop, or
    SGLang's kernel set (`load_sglang_gdn()`) to run SGLang's serial verifier."""

    def __init__(self, kernels: Any = None):
        self.kernels = kernels
        self._fn = None if kernels is None else _sglang_fn(kernels)

    @property
    def engine(self) -> str:
        return "torch" if self._fn is None else "sglang"

    @staticmethod
    def buffer_shape(n_layers: int, batch: int, max_nodes: int, state: torch.Tensor) -> tuple:
        return (n_layers, batch, max_nodes + 1) + tuple(state.shape[-3:])

    def verify_layer(self, snaps: torch.Tensor, q, k, v, g, beta, a, b, A_log, dt_bias,
                     state: torch.Tensor, tb, *, scale: Optional[float] = None) -> torch.Tensor:
        """One GDN layer: snaps [B, T+1, HV, V, K] (written), state [S, HV, V, K] (read).
        q, k [N, H, K]; v [N, HV, V]; g, beta (gates) and a, b (raw gate inputs) [N, HV].
        Returns o [N, HV, V] in v's dtype."""
        snaps[:, 0].copy_(state.index_select(0, tb.slots))
        if self._fn is not None:
            return self._verify_sglang(snaps, q, k, v, a, b, A_log, dt_bias, state, tb)
        return self._verify_torch(snaps, q, k, v, g, beta, tb, scale)

    def _verify_torch(self, snaps, q, k, v, g, beta, tb, scale):
        cdt = snaps.dtype
        bsz, t_max = tb.batch, tb.max_nodes
        hv, vdim, kdim = snaps.shape[-3:]
        group = hv // k.shape[1]
        q = l2norm(q.to(cdt)) * (kdim ** -0.5 if scale is None else scale)
        k = l2norm(k.to(cdt))
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        padded = tb.padded  # zeros past each tree: g = beta = 0 there, harmless steps
        kp, qp = padded(k), padded(q)
        vp = padded(v.to(cdt))
        gam = torch.exp(padded(g.to(cdt)))  # [B, T, HV]
        bp = padded(beta.to(cdt))
        kq = torch.stack([kp, qp], dim=-1)  # [B, T, HV, K, 2]
        kdotq = (kp * qp).sum(-1, keepdim=True)  # [B, T, HV, 1]
        flat = snaps.view((bsz * (t_max + 1),) + tuple(snaps.shape[2:]))
        o = torch.empty(bsz, t_max, hv, vdim, dtype=cdt, device=snaps.device)
        for t in range(t_max):
            sp = flat.index_select(0, tb.parent_rows[t])  # parents' states [B, HV, V, K]
            r = torch.bmm(sp.view(bsz * hv, vdim, kdim), kq[:, t].reshape(bsz * hv, kdim, 2))
            r = r.view(bsz, hv, vdim, 2)
            gt = gam[:, t, :, None]
            u = bp[:, t, :, None] * (vp[:, t] - gt * r[..., 0])  # beta (v - exp(g) S k)
            o[:, t] = gt * r[..., 1] + u * kdotq[:, t]  # (exp(g) S + u k^T) q
            dst = snaps[:, t + 1]
            torch.mul(sp, gt[..., None], out=dst)
            dst.addcmul_(u[..., :, None], kp[:, t, :, None, :])
        return o.view(bsz * t_max, hv, vdim).index_select(0, tb.pad_index).to(v.dtype)

    def _verify_sglang(self, snaps, q, k, v, a, b, A_log, dt_bias, state, tb):
        if not tb.host_single_root:
            raise InputError("SGLang's serial verifier takes single-root trees (node 0 the root)")
        o = self._fn(
            A_log=A_log, dt_bias=dt_bias, q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0),
            a=a, b=b, initial_state_source=state, initial_state_indices=tb.slots,
            cu_seqlens=tb.cu_seqlens, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
            softplus_threshold=20.0, is_kda=False, disable_state_update=True,
            intermediate_states_buffer=snaps[:, 1:],
            intermediate_state_indices=torch.arange(tb.batch, dtype=torch.int32, device=snaps.device),
            cache_steps=tb.max_nodes + 1, retrieve_parent_token=tb.sglang_parents,
        )
        return o.reshape(v.shape)

    def decode_layer(self, q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens) -> torch.Tensor:
        """SGLang's fused one-token decode (state updated in place); sglang engine only.
        Packed (varlen) form, so q/k/v may be row-strided views; cu_seqlens = arange(B+1)."""
        o = self._fn(
            A_log=A_log, dt_bias=dt_bias, q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0),
            a=a, b=b, initial_state_source=state, initial_state_indices=slots,
            cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
            softplus_threshold=20.0, is_kda=False,
        )
        return o.reshape(v.shape)

    @staticmethod
    def commit(state: torch.Tensor, snaps: torch.Tensor, tb, accepted: torch.Tensor) -> None:
        """Copy each request's accepted snapshot (row accepted+1; -1 copies S_pre back,
        unchanged) into the pool, every layer at once. state [L, S, ...]; snaps [L, B, T+1, ...]."""
        rows = torch.arange(tb.batch, device=snaps.device)
        state[:, tb.slots] = snaps[:, rows, accepted + 1]
