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
def gate_params(A_log, dt_bias, hv, GATED: tl.constexpr):
    """(-exp(A_log), dt_bias) of value head hv when g and beta hold SGLang's raw a and b (the
    gates fused into the kernel, as its verifier does); zeros, never read, otherwise."""
    if GATED:
        neg_a = -tl.exp(tl.load(A_log + hv).to(tl.float32))
        bias = tl.load(dt_bias + hv).to(tl.float32)
    else:
        neg_a = 0.0
        bias = 0.0
    return neg_a, bias


@triton.jit
def row_gates(g, beta, rows_g, rmask, hv, s_gn, s_gh, s_bn, s_bh, neg_a, bias, GATED: tl.constexpr,
              WANT_BETA: tl.constexpr):
    """(log decays g, gates beta) of rows rows_g of value head hv, gated from SGLang's raw a
    and b when GATED (neg_a, bias from gate_params); zero in rows outside the request, and
    beta zero unless WANT_BETA."""
    gr = tl.load(g + rows_g * s_gn + hv * s_gh, mask=rmask, other=0.0).to(tl.float32)
    if GATED:
        gr = tl.where(rmask, neg_a * softplus(gr + bias), 0.0)
    br = gr * 0.0
    if WANT_BETA:
        br = tl.load(beta + rows_g * s_bn + hv * s_bh, mask=rmask, other=0.0).to(tl.float32)
        if GATED:
            br = tl.where(rmask, tl.sigmoid(br), 0.0)
    return gr, br


@triton.jit
def valid_parents(parents, rows_g, rows, rmask):
    """Each row's local parent, -1 for a root or for a parent that does not precede it (that
    ends the path, as in every kernel here)."""
    par = tl.load(parents + rows_g, mask=rmask, other=-1).to(tl.int32)
    return tl.where(rmask & (par >= 0) & (par < rows), par, -1)


@triton.jit
def unit_scales(nk, nq, scale, USE_L2NORM: tl.constexpr):
    """The row factors that make k unit and q unit times `scale` (x / sqrt(sum x^2 + 1e-6),
    as SGLang and fla do), from the rows' squared norms nk, nq [R]; 1 and `scale` without
    the L2 norm."""
    if USE_L2NORM:
        inv_k = 1.0 / tl.sqrt(nk + 1e-6)
        inv_q = scale / tl.sqrt(nq + 1e-6)
    else:
        inv_k = nk * 0.0 + 1.0
        inv_q = nq * 0.0 + scale
    return inv_k, inv_q


@triton.jit
def forest_span(cu, b, n_rows):
    """Request b of a packed forest of n_rows nodes: (first node, node count), int64, clamped
    to the forest, so garbage offsets never move a read or write outside the arguments
    (docs/design.md §3). A min and a max on the two offsets it loads: no load before the work."""
    start = tl.minimum(tl.maximum(tl.load(cu + b).to(tl.int64), 0), n_rows)
    end = tl.minimum(tl.maximum(tl.load(cu + b + 1).to(tl.int64), start), n_rows)
    return start, end - start


@triton.jit
def request_span(cu, state_idx, b, n_slots, n_rows):
    """Request b of a packed forest: (first node, node count, state-pool slot, whether the
    slot is inside the pool of n_slots). One compare per program guards the pool against a
    bad slot without a host check; the span is forest_span's."""
    start, n_nodes = forest_span(cu, b, n_rows)
    slot = tl.load(state_idx + b).to(tl.int64)
    return start, n_nodes.to(tl.int32), slot, (slot >= 0) & (slot < n_slots)


@triton.jit
def poison_rows(o, u, log_p, first, n_rows, v0, hv, s_on, s_oh, s_un, s_uh, s_ln, write_log_p,
                V: tl.constexpr, R: tl.constexpr, BV: tl.constexpr, VT: tl.constexpr):
    """NaN into rows first..first+n_rows of o and u (value columns v0..v0+VT of head hv) and,
    if write_log_p, of log_p: the outputs of a request the kernel must not compute (a slot
    outside the pool, a broken max_nodes promise), so the fault cannot pass unseen."""
    rows = tl.arange(0, R)
    for r0 in range(0, n_rows, R):
        extra = r0 + rows
        emask = extra < n_rows
        for vt in range(0, VT, BV):
            offs_v = v0 + vt + tl.arange(0, BV)
            tile = emask[:, None] & (offs_v < V)[None, :]
            nan_tile = tl.full([R, BV], float("nan"), tl.float32)
            tl.store(u + (first + extra)[:, None] * s_un + hv * s_uh + offs_v[None, :], nan_tile, mask=tile)
            tl.store(o + (first + extra)[:, None] * s_on + hv * s_oh + offs_v[None, :],
                     nan_tile.to(o.dtype.element_ty), mask=tile)
        if write_log_p:
            tl.store(log_p + (first + extra) * s_ln + hv, tl.full([R], float("nan"), tl.float32), mask=emask)


@triton.jit
def accepted_node(accepted, b, n_rows):
    """accepted[b] as an int32 node, or -1 (commit nothing) where it lies outside [0, n_rows):
    compared at the vector's own width first, so an int64 entry past 2^31 cannot wrap into
    the tree (docs/design.md §3)."""
    a = tl.load(accepted + b)
    return tl.where((a >= 0) & (a < n_rows), a, -1).to(tl.int32)


@triton.jit
def commit_program(accepted, n_req, n_rows):
    """(layer, request b, value head, value tile, accepted node) of a commit program: one per
    (layer x request, value head, value tile), as both commits launch them."""
    pid = tl.program_id(0)
    b = pid % n_req
    return (pid // n_req).to(tl.int64), b, tl.program_id(1), tl.program_id(2), accepted_node(accepted, b, n_rows)


@triton.jit
def commit_target(cu, state_idx, b, a, n_slots, n_rows):
    """(first row, node count, pool slot, accepted node, in_pool) of request b committing node
    a >= 0, its span forest_span's: a slot outside the pool or a node outside the span clamps
    the row, the count, the slot and the node to 0 for the loads (row 0 exists: the launchers
    return before an empty forest) and in_pool False masks the store. ALU on the loads the
    program already waits for, none added (no host check: docs/design.md §3)."""
    start, n_nodes = forest_span(cu, b, n_rows)
    slot = tl.load(state_idx + b).to(tl.int64)
    in_pool = (slot >= 0) & (slot < n_slots) & (a < n_nodes)
    return (tl.where(in_pool, start, 0), tl.where(in_pool, n_nodes, 0), tl.where(in_pool, slot, 0),
            tl.where(in_pool, a, 0), in_pool)


@triton.jit
def is_long_chain(parents, start, n_solved, TP: tl.constexpr, DS: tl.constexpr):
    """Whether a request's tree of n_solved nodes is a chain (parents[i] = i - 1 throughout)
    of more than DS nodes (its last node has DS strict ancestors or more). The chain kernel
    takes exactly these requests and the blocked kernel, after it, the others: both ask
    this, so exactly one of them writes each row."""
    alln = tl.arange(0, TP)
    amask = alln < n_solved
    par = tl.load(parents + start + alln, mask=amask, other=-1).to(tl.int32)
    return (tl.sum(tl.where(amask & (par != alln - 1), 1, 0), axis=0) == 0) & (n_solved > DS)


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

