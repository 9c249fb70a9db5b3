"""Small @triton.jit helpers shared by several kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(x):
    """log1p(exp(x)) with SGLang's threshold 20 and Kahan's log1p for small exp(x)."""
    ex = tl.exp(tl.minimum(x, 20.0))
    one_plus = 1.0 + ex
    log1p = tl.where(one_plus == 1.0, ex, tl.log(one_plus) * ex / (one_plus - 1.0))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def request_span(cu, state_idx, b):
    """Request b of a packed forest: (first node, node count, state-pool slot)."""
    start = tl.load(cu + b).to(tl.int64)
    n_nodes = (tl.load(cu + b + 1) - start).to(tl.int32)
    slot = tl.load(state_idx + b).to(tl.int64)
    return start, n_nodes, slot
