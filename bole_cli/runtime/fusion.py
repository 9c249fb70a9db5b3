"""The elementwise pieces between a layer's matmuls and kernels, as torch.compile fuses them
(docs/design.md §8, "The decode step").

Eager PyTorch runs each of these as several kernels (an add, a cast, a square, a mean, a
rsqrt, two multiplies, another cast...), a few microseconds each, and a decode step of a
64-layer model runs hundreds of them: production engines fuse them by hand (residual add
+ RMSNorm, the attention's q/k norm + RoPE, a tree's masked attention part and its merge
with the cache part). Here the compiler does it where it fuses well: each piece is a
pure function compiled once (weights are arguments, so every layer shares one compiled
kernel per token count) and captured in the step's CUDA graph like any kernel. `Fusion(
compile=False)` runs the same functions eagerly: same arithmetic, the CPU path of the
tests. Where it splits a piece into many kernels, a Triton kernel does it instead: the
attention's input (kernels.attention_in), the tree part of a verify's attention
(kernels.cache_attention), and, with the skinny GEMM on, the add + RMSNorm and SwiGLU
around the projections (NormedRows, kernels.skinny_mm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RMS_EPS = 1e-6
COMPILE_BACKEND = "inductor"  # the tests trace the same functions with "eager" (no C compiler needed)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def add_rms(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next RMSNorm: (x + y, rms(x + y) w)."""
    s = x + y
    return s, rms(s, w)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over the fused [.., 2F] gate|up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial rotary embedding over the first 2 * cos.shape[-1] channels of each head."""
    half = cos.shape[-1]
    if half == 0:
        return x
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half: 2 * half]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], dim=-1)


def attn_in(proj: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    """The fused q|gate|k|v projection -> q (RMSNorm, RoPE), gate [N, heads, head_dim] (a
    view), k (RMSNorm, RoPE), v (a view). kernels.attention_in is the same in one launch."""
    n, hq, hk, dh = proj.shape[0], heads, kv_heads, head_dim
    qg = proj[:, : 2 * hq * dh].view(n, hq, 2 * dh)
    q, gate = qg[..., :dh], qg[..., dh:]
    k = proj[:, 2 * hq * dh: (2 * hq + hk) * dh].view(n, hk, dh)
    v = proj[:, (2 * hq + hk) * dh:].view(n, hk, dh)
    return rope(rms(q, q_norm), cos, sin), gate, rope(rms(k, k_norm), cos, sin), v


def gated_out(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The attention output times sigmoid(gate) [N, heads, head_dim], flattened for o_proj."""
    return (o.reshape(gate.shape) * torch.sigmoid(gate)).flatten(1)


def gated_norm(o: torch.Tensor, z: torch.Tensor, norm_w: torch.Tensor, fdtype: torch.dtype) -> torch.Tensor:
    """The GDN output's per-head gated RMSNorm, rms(o) w silu(z), in the factor dtype, then
    flattened in o's dtype for out_proj. o [N, HV, V]; z [N, HV V]."""
    n, hv, dv = o.shape
    y = F.rms_norm(o.to(fdtype), (dv,), norm_w.to(fdtype), RMS_EPS)
    y = y * F.silu(z.reshape(n, hv, dv).to(fdtype))
    return y.reshape(n, hv * dv).to(o.dtype)


def mtp_in(tokens: torch.Tensor, embed: torch.Tensor, hidden: torch.Tensor, emb_norm: torch.Tensor,
           hid_norm: torch.Tensor) -> torch.Tensor:
    """An MTP head's input: the tokens' embeddings and the previous hidden states, each
    RMS-normed, side by side [N, 2 hidden] for its fc."""
    return torch.cat([rms(F.embedding(tokens, embed), emb_norm), rms(hidden, hid_norm)], dim=-1)


class NormedRows:
    """rms(x + y) w, a layer's input, not computed until its projection reads it: a skinny
    projection (kernels.skinny_mm) fuses the add and the norm into its weight stream, and
    any other reader materialises them once (`rows`). `total()` is x + y, the residual
    stream the next add reads, from whichever ran. y None: rms(x) w, x the stream."""

    def __init__(self, x: torch.Tensor, y, w: torch.Tensor, fuse: "Fusion"):
        self.x, self.y, self.w, self.fuse = x, y, w, fuse
        self.sum = x if y is None else None
        self._rows = None

    def rows(self) -> torch.Tensor:
        """The normed rows, computed here the first time (add + RMSNorm, compiled)."""
        if self._rows is None:
            if self.y is None:  # compiled too: eager F.rms_norm took 6 us at one row (experiments/README.md S28-a)
                self._rows = self.fuse.rms(self.x, self.w)
            else:
                self.sum, self._rows = self.fuse.add_rms(self.x, self.y, self.w)
        return self._rows

    def total(self) -> torch.Tensor:
        """x + y once a projection read the rows (or computed here if none did)."""
        if self.sum is None:
            self.rows()
        return self.sum


class Fusion:
    """The pieces above, compiled (compile=True) or eager."""

    def __init__(self, compile: bool, backend: str = COMPILE_BACKEND):
        self.compiled = bool(compile)
        wrap = ((lambda f: torch.compile(f, backend=backend, fullgraph=True)) if self.compiled
                else (lambda f: f))
        self.rms = wrap(rms)
        self.add_rms = wrap(add_rms)
        self.swiglu = wrap(swiglu)
        self.attn_in = wrap(attn_in)
        self.gated_out = wrap(gated_out)
        self.gated_norm = wrap(gated_norm)
        self.mtp_in = wrap(mtp_in)
