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


# Trees at most this deep invert (I + G) by the product form (I - G)(I + G^2)(I + G^4): at
# most 3 squarings, and G's powers stay small (paths of <= 8 levels). Deeper trees merge
# blocks instead (`inverse_by_blocks`): the powers grow like path counts and cancel in float32.
PRODUCT_FORM_DEPTH = tl.constexpr(8)


@triton.jit
def inverse_by_blocks(gram, idx, n, PRECISION: tl.constexpr):
    """(I + G)^-1 for G [N, N] strictly lower triangular (rows and columns `idx`, the first
    `n` in use): X = (I + G_b)^-1 for the b x b block diagonal of G is known, E holds the
    blocks just below it inside each 2b x 2b block, and (I + G_2b)^-1 = X - X E X, exactly.
    Every intermediate is a block of the true inverse, so float32 keeps ~1e-7 where the
    product form loses every digit (a 64-node chain with correlated keys: experiments/NOTES.md)."""
    eye = idx[:, None] == idx[None, :]
    x = tl.where(eye, 1.0, 0.0)
    blk = n * 0 + 1
    while blk < n:
        same_pair = (idx[:, None] // (2 * blk)) == (idx[None, :] // (2 * blk))
        e = tl.where(same_pair & ((idx[:, None] // blk) != (idx[None, :] // blk)), gram, 0.0)
        x -= tl.dot(x, tl.dot(e, x, input_precision=PRECISION), input_precision=PRECISION)
        blk = 2 * blk
    return x
