"""Closed-form tree verify through one GDN layer (docs/design.md §2, Theorem 1).

Trees of at most 64 nodes go to the one-tile kernel (tree_verify_tile.py); this module
holds the public API and the blocked kernel for larger trees (up to 256 nodes). Past one
tile, chains of more than CHAIN_KERNEL_DEPTH nodes take the chain kernels
(tree_verify_chain.py) and the blocked kernel, launched after them in its REMAINDER mode,
skips exactly those; shallow trees of a known depth take the level kernel
(tree_verify_levels.py) instead, by the rule (configs.py).

Blocked kernel (v10; experiments/README.md rows I17-a to I17-k): one program per (request, value head, value tile). First
the whole tree at once: each node's ancestor-or-self set as NW 64-bit words and logP, by
pointer jumping over the TP rows held in registers (ceil(log2(depth + 1)) steps of
tl.gather, as in the one-tile kernel; the level-a-step walk it replaced made 256-node chains
slow). Then chunks of BC consecutive nodes in order (parents come first, so a chunk only
depends on earlier chunks): for chunk c,

    R_c = D_beta (V_c - D_P K_c S^T)  -  sum_{c' < c} G[c, c'] U_c'
    U_c = (I + G_cc)^-1 R_c            (product form (I-G)(I+G^2)(I+G^4)... up to depth 8,
                                        merged diagonal blocks beyond: jit_math)
    O_c = D_P Q_c S^T  +  sum_{c' <= c} C[c, c'] U_c'

G and C are the ancestor-masked Gram terms built from k, q and exp(logP_i - logP_j); they
are rebuilt per value tile from k and q and never materialise a per-node state; a chunk
pair with no ancestor link (wide trees, several roots) is skipped. U of finished chunks is
written to `u` and read back by later chunks of the same program (hence the barrier).
TP is the promised tree size rounded up to a power of two (else 256): a request larger
than it, or whose slot lies outside the pool, gets NaN rows and its slot is never read.
Measured history and what limits it: experiments/NOTES.md "Big trees".
"""

from __future__ import annotations

import inspect
import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels._env import interpreting
from bole_cli.kernels.configs import chain_launch_config, launch_config, levels_launch_config
from bole_cli.kernels.jit_math import (PRODUCT_FORM_DEPTH, gate_params, inverse_by_blocks, is_long_chain,
                                      pending_rows, poison_rows, request_span, unit_scales)
from bole_cli.kernels.types import PendingPath, VerifyResult
from bole_cli.kernels.tree_verify_chain import chain_factors_kernel, chain_scan_kernel, chain_scratch_shape
from bole_cli.kernels.tree_verify_levels import levels_gram_kernel, levels_scratch, levels_width, tree_levels_kernel
from bole_cli.kernels.tree_verify_parts import ancestor_words, parts_grid, parts_kernel, state_products
from bole_cli.kernels.tree_verify_tile import tree_verify_tile_kernel, value_split
from bole_cli.kernels.verify_path import is_tile_launch
from bole_cli.limits import CHAIN_KERNEL_DEPTH
from bole_cli.kernels.validate import (
    ACTIVATION_DTYPES,
    MAX_TREE_NODES,
    STATE_DTYPES,
    check_config,
    check_flag,
    check_forest,
    check_forest_vectors,
    check_last_contiguous,
    check_nonempty,
    check_out,
    check_pending,
    check_pool_slots,
    check_scale,
    check_shape,
    check_tensor,
    contiguous_vector,
)

NW = MAX_TREE_NODES // 64  # 64-bit ancestor words per node
# SPLIT's parts (tree_verify_parts.py), not tuned per GPU: the state products' rows, value
# columns and key slice a program, the Gram tile, the launch's warps and stages, the roles
# it runs (all three; fewer only to time them apart) (H200, I17-k: NOTES.md "Big trees")
PARTS = {"BR": 64, "BV": 64, "BK": 32, "BG": 64, "num_warps": 4, "num_stages": 3, "ROLES": 7}


@triton.jit
def _block_mask(bits, cols, c0, NW: tl.constexpr):
    """[BC, BC] mask: column j (local index cols[j], all in one 64-bit word) is in row i's A+."""
    word = c0 // 64
    sel = tl.arange(0, NW)[None, :] == word
    row_word = tl.sum(tl.where(sel, bits, 0), axis=1)  # [BC] int64
    shift = (cols % 64).to(tl.int64)
    return ((row_word[:, None] >> shift[None, :]) & 1) != 0


@triton.jit
def _gram(a, b, rows_g, rmask, h, s_an, s_ah, s_bn, s_bh, K: tl.constexpr, KP: tl.constexpr,
          BC: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, GRAM16: tl.constexpr):
    """A_c B_c^T of one chunk's rows (raw, unnormalised) over key-dim slices."""
    acc = tl.zeros([BC, BC], dtype=tl.float32)
    for kb in range(0, KP, BK):
        offs = kb + tl.arange(0, BK)
        m2 = rmask[:, None] & (offs < K)[None, :]
        an = tl.load(a + rows_g[:, None] * s_an + h * s_ah + offs[None, :], mask=m2, other=0.0)
        bn = tl.load(b + rows_g[:, None] * s_bn + h * s_bh + offs[None, :], mask=m2, other=0.0)
        if GRAM16:  # 16-bit inputs: their products are exact in the float32 accumulator
            acc += tl.dot(an, tl.trans(bn))
        else:
            acc += tl.dot(an.to(tl.float32), tl.trans(bn.to(tl.float32)), input_precision=PRECISION)
    return acc


@triton.jit
def _gram_block(at, rows, cols, n, TP: tl.constexpr):
    """[BC, BC] block (rows, cols) of a request-head's [TP, TP] Gram workspace (zero
    outside the tree's n nodes: never read there). The parts write every tile on or below
    the diagonal, at least BC wide (_blocked), so every entry read here is written."""
    return tl.load(at + rows[:, None] * TP + cols[None, :], mask=(rows < n)[:, None] & (cols < n)[None, :],
                   other=0.0)


@triton.jit(do_not_specialize=["n_slots"])
def _tree_verify_kernel(
    q, k, v, g, beta, A_log, dt_bias, state, state_idx, parents, cu, o, u, log_p,
    pend_k, pend_u, pend_lp, pend_n,
    scale, n_slots, n_hv,
    s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_gn, s_gh, s_bn, s_bh,
    s_sn, s_sh, s_sv, s_on, s_oh, s_un, s_uh, s_ln,
    ys, kk_ws, qk_ws, bits_ws, s_yn, s_yh,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
    BC: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, NW: tl.constexpr, TP: tl.constexpr,
    DS: tl.constexpr, REMAINDER: tl.constexpr, SPLIT: tl.constexpr,
    USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr, GATED: tl.constexpr, GRAM16: tl.constexpr,
    LP: tl.constexpr, LPP: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP
    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots)
    if SPLIT:  # the Gram terms of (request, key head): tree_verify_parts.py's Gram role
        kk_at = kk_ws + (b.to(tl.int64) * (n_hv // GROUP) + h) * TP * TP
        qk_at = qk_ws + (b.to(tl.int64) * (n_hv // GROUP) + h) * TP * TP
    # a slot outside the pool, or a tree larger than the promised TP: no chunk runs, NaN rows
    n_solved = tl.where(in_pool & (n_nodes <= TP), n_nodes, 0)
    n_poison = n_nodes - n_solved
    if REMAINDER:  # after the chain kernel, which took the chains at least DS deep
        n_solved = tl.where(is_long_chain(parents, start, n_solved, TP, DS), 0, n_solved)

    offs_v = iv * BV + tl.arange(0, BV)
    vmask = offs_v < V
    if LP > 0:  # a deferred commit: the slot's true state (jit_math.pending_slice)
        uw, decay, prow, pused = pending_rows(pend_u, pend_lp, pend_n, slot, n_solved > 0, hv, n_hv, offs_v, vmask,
                                              V, LP, LPP)
    else:  # (never read)
        uw, decay, prow, pused = 0.0, 0.0, 0, 0
    lane = tl.arange(0, BC)
    words = tl.arange(0, NW)
    neg_a, bias = gate_params(A_log, dt_bias, hv, GATED)

    # The whole tree at once (TP rows in registers): ancestor-or-self bitmask (NW 64-bit
    # words a row) and logP by pointer jumping, ceil(log2(depth + 1)) steps of tl.gather, as
    # the one-tile kernel does; chunks below take their rows with one more gather each.
    if not SPLIT:  # (SPLIT: the parts' walk wrote them; the chunks load their rows)
        bits, lp = ancestor_words(parents, g, start, n_solved, hv, s_gn, s_gh, neg_a, bias, TP, NW, GATED)

    for c in range(0, tl.cdiv(n_solved, BC)):
        c0 = c * BC
        rows = c0 + lane
        rmask = rows < n_nodes
        rows_g = start + rows
        if SPLIT:
            rbits = tl.load(bits_ws + rows_g[:, None] * NW + words[None, :], mask=rmask[:, None], other=0)
            lpc = tl.load(log_p + rows_g * s_ln + hv, mask=rmask, other=0.0)
        else:
            rbits = tl.gather(bits, tl.broadcast_to(rows[:, None], (BC, NW)), 0)
            lpc = tl.gather(lp, rows, 0)
        bc = tl.load(beta + rows_g * s_bn + hv * s_bh, mask=rmask, other=0.0).to(tl.float32)
        if GATED:
            bc = tl.where(rmask, tl.sigmoid(bc), 0.0)
        p = tl.exp(lpc)

        # The chunk's products with the state over key-dim slices (whole [BC, K] float32
        # operands do not fit the registers); the L2 norms come from the same slices and
        # scale the products afterwards.
        if SPLIT:  # unit and scaled already (tree_verify_parts.py's state products)
            tile = rmask[:, None] & vmask[None, :]
            xs = tl.load(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], mask=tile, other=0.0)
            ys_c = tl.load(ys + rows_g[:, None] * s_yn + hv * s_yh + offs_v[None, :], mask=tile, other=0.0)
            inv_k = tl.full([BC], 1.0, tl.float32)
            inv_q = tl.full([BC], 1.0, tl.float32)
        else:
            xs, ys_c, nk, nq = state_products(q, k, state, rows_g, rmask, h, hv, slot, offs_v, vmask, s_qn, s_qh, s_kn,
                                              s_kh, s_sn, s_sh, s_sv, uw, decay, pend_k, prow, pused, n_hv // GROUP,
                                              K, KP, BK, BC, BV, LP, USE_L2NORM, PRECISION)
            inv_k, inv_q = unit_scales(nk, nq, scale, USE_L2NORM)
        vc = tl.load(v + rows_g[:, None] * s_vn + hv * s_vh + offs_v[None, :],
                     mask=rmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        r = bc[:, None] * (vc - (p * inv_k)[:, None] * xs)
        out = (p * inv_q)[:, None] * ys_c

        # Earlier chunks: R -= G[c, c'] U_c', O += C[c, c'] U_c' (U_c' written by this program
        # before the barrier). A pair with no ancestor link (wide trees, several roots) is skipped.
        for c2 in range(0, c):
            cols = c2 * BC + lane
            m = _block_mask(rbits, cols, c2 * BC, NW)
            if tl.max(tl.max(m.to(tl.int32), axis=1), axis=0) > 0:
                cols_g = start + cols
                if SPLIT:
                    kkj = _gram_block(kk_at, rows, cols, n_solved, TP)
                    qkj = _gram_block(qk_at, rows, cols, n_solved, TP)
                    inv_kj = tl.full([BC], 1.0, tl.float32)
                else:
                    kkj = tl.zeros([BC, BC], dtype=tl.float32)
                    qkj = tl.zeros([BC, BC], dtype=tl.float32)
                    nkj = tl.zeros([BC], dtype=tl.float32)
                    for kb in range(0, KP, BK):
                        offs = kb + tl.arange(0, BK)
                        m2 = rmask[:, None] & (offs < K)[None, :]
                        kn = tl.load(k + rows_g[:, None] * s_kn + h * s_kh + offs[None, :], mask=m2, other=0.0)
                        qn = tl.load(q + rows_g[:, None] * s_qn + h * s_qh + offs[None, :], mask=m2, other=0.0)
                        kj = tl.load(k + cols_g[:, None] * s_kn + h * s_kh + offs[None, :],
                                     mask=(offs < K)[None, :], other=0.0)
                        if USE_L2NORM:
                            kjf = kj.to(tl.float32)
                            nkj += tl.sum(kjf * kjf, axis=1)
                        if GRAM16:
                            kkj += tl.dot(kn, tl.trans(kj))
                            qkj += tl.dot(qn, tl.trans(kj))
                        else:
                            kkj += tl.dot(kn.to(tl.float32), tl.trans(kj.to(tl.float32)), input_precision=PRECISION)
                            qkj += tl.dot(qn.to(tl.float32), tl.trans(kj.to(tl.float32)), input_precision=PRECISION)
                    if USE_L2NORM:
                        inv_kj = 1.0 / tl.sqrt(nkj + 1e-6)
                    else:
                        inv_kj = tl.full([BC], 1.0, tl.float32)
                if SPLIT:
                    lpj = tl.load(log_p + cols_g * s_ln + hv)
                else:
                    lpj = tl.gather(lp, cols, 0)
                uj = tl.load(u + cols_g[:, None] * s_un + hv * s_uh + offs_v[None, :],
                             mask=vmask[None, :], other=0.0)
                ratio = tl.where(m, tl.exp(tl.minimum(lpc[:, None] - lpj[None, :], 0.0)), 0.0) * inv_kj[None, :]
                gram = (bc * inv_k)[:, None] * ratio * kkj
                cmat = inv_q[:, None] * ratio * qkj
                r -= tl.dot(gram, uj, input_precision=PRECISION)
                out += tl.dot(cmat, uj, input_precision=PRECISION)

        # The diagonal block: K_c K_c^T first, the solve, then Q_c K_c^T (two passes over the
        # slices, so that only one [BC, BC] Gram tile is live next to the solve's).
        m = _block_mask(rbits, rows, c0, NW)
        ratio = tl.where(m, tl.exp(tl.minimum(lpc[:, None] - lpc[None, :], 0.0)), 0.0) * inv_k[None, :]
        if SPLIT:
            kk = _gram_block(kk_at, rows, rows, n_solved, TP)
        else:
            kk = _gram(k, k, rows_g, rmask, h, s_kn, s_kh, s_kn, s_kh, K, KP, BC, BK, PRECISION, GRAM16)
        gram = tl.where(m & (rows[None, :] != rows[:, None]), (bc * inv_k)[:, None] * ratio * kk, 0.0)

        # (I + G_cc)^-1 R: the product form (I - G)(I + G^2)(I + G^4)... (G nilpotent of
        # index depth + 1) up to PRODUCT_FORM_DEPTH, merged diagonal blocks beyond
        # (float32-stable at any depth; docs/design.md §2).
        depth = tl.max(tl.sum(m.to(tl.int32), axis=1), axis=0) - 1
        if depth <= PRODUCT_FORM_DEPTH:
            x = r - tl.dot(gram, r, input_precision=PRECISION)
            gpow = gram
            covered = depth * 0 + 1
            while covered < depth:
                gpow = tl.dot(gpow, gpow, input_precision=PRECISION)
                x += tl.dot(gpow, x, input_precision=PRECISION)
                covered = 2 * covered + 1
        else:
            x = tl.dot(inverse_by_blocks(gram, lane, tl.minimum(n_nodes - c0, BC), PRECISION), r,
                       input_precision=PRECISION)
        if SPLIT:
            qk = _gram_block(qk_at, rows, rows, n_solved, TP)
        else:
            qk = _gram(q, k, rows_g, rmask, h, s_qn, s_qh, s_kn, s_kh, K, KP, BC, BK, PRECISION, GRAM16)
        out += tl.dot(inv_q[:, None] * ratio * qk, x, input_precision=PRECISION)

        tile = rmask[:, None] & vmask[None, :]
        tl.store(u + rows_g[:, None] * s_un + hv * s_uh + offs_v[None, :], x, mask=tile)
        tl.store(o + rows_g[:, None] * s_on + hv * s_oh + offs_v[None, :], out.to(o.dtype.element_ty), mask=tile)
        if (iv == 0) & (not SPLIT):
            tl.store(log_p + rows_g * s_ln + hv, lpc, mask=rmask)
        tl.debug_barrier()  # later chunks of this program read u back
    # ... and its outputs are NaN instead (no rows when the request was solved)
    poison_rows(o, u, log_p, start, n_poison, iv * BV, hv, s_on, s_oh, s_un, s_uh, s_ln, iv == 0,
                V, BC, BV, BV)


_BLOCKED_ARGS = tuple(inspect.signature(_tree_verify_kernel.fn).parameters)  # its parameters' names, in order


def _blocked_tp(max_nodes: Optional[int]) -> int:
    """Rows of the blocked kernel's whole-tree walk: the promised size rounded up to a power
    of two (a larger request gets NaN rows), else the limit."""
    return max(64, triton.next_power_of_2(max_nodes or MAX_TREE_NODES))


def tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    check_trees: bool = True,
    max_nodes: Optional[int] = None,
    max_depth: Optional[int] = None,
    config: Optional[dict] = None,
    out: Optional[VerifyResult] = None,
    pending: Optional[PendingPath] = None,
) -> VerifyResult:
    """Verify a packed forest of draft trees through one GDN layer in closed form.

    Shapes (docs/design.md §3): q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV]; state
    [S, HV, V, K] float32 or bfloat16 (read only); state_indices [B]; parents [N] local,
    -1 for a root; cu_seqlens [B+1]. Returns VerifyResult(o [N, HV, V] in v's dtype,
    u [N, HV, V] float32, log_p [N, HV] float32). `out` reuses preallocated outputs.

    max_nodes: the largest tree in the batch (a promise, checked when check_trees). Trees of
    at most 64 nodes take the one-tile kernel; without the bound and without check_trees
    (which reads the sizes on the host) the big-tree kernels, exact for any size, are used.
    max_depth: the most strict ancestors of any node (a promise, checked when check_trees).
    Past one tile, chains of more than CHAIN_KERNEL_DEPTH nodes (as many strict ancestors or
    more) take the chain kernels (tree_verify_chain.py) and other trees the blocked one; a
    promise below CHAIN_KERNEL_DEPTH (or the host check) saves the chain kernels' launches
    and, by the rule (small batches), takes the level kernel (tree_verify_levels.py). Off
    the level kernel a request neither kernel takes (a broken promise) is computed by the
    blocked kernel; on it, a request deeper than the promise gets NaN rows.

    pending: a deferred commit's rows for this layer (tree_commit_deferred.py): each slot's
    true state, exp(logP_end) S + its pending rows' u k^T, is what the trees see.

    state_indices outside [0, S): an InputError with check_trees; without it (CUDA graphs,
    no host read) that request's o, u and log_p are NaN and the pool is never read there.
    1-D arguments may be strided views (they are copied contiguous); bad input raises one
    InputError naming the argument (docs/design.md §3).
    """
    return _verify(q, k, v, g, beta, None, None, state, state_indices, parents, cu_seqlens, False,
                   scale=scale, use_qk_l2norm=use_qk_l2norm, check_trees=check_trees,
                   max_nodes=max_nodes, max_depth=max_depth, config=config, out=out, pending=pending)


def tree_verify_gated(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    parents: torch.Tensor,
    cu_seqlens: torch.Tensor,
    **kwargs,
) -> VerifyResult:
    """tree_verify with the gates fused in: a, b [N, HV] raw (g = -exp(A_log) softplus(a +
    dt_bias), beta = sigmoid(b)), as SGLang's target_verify receives them. Saves a launch
    and a round trip of g and beta through memory."""
    return _verify(q, k, v, a, b, A_log, dt_bias, state, state_indices, parents, cu_seqlens, True, **kwargs)


def _verify(q, k, v, g, beta, A_log, dt_bias, state, state_indices, parents, cu_seqlens, gated, *,
            scale=None, use_qk_l2norm=True, check_trees=True, max_nodes=None, max_depth=None,
            config=None, out=None, pending=None) -> VerifyResult:
    gname, bname = ("a", "b") if gated else ("g", "beta")
    check_tensor("q", q, 3, ACTIVATION_DTYPES)
    dev = q.device
    n, h, kdim = q.shape
    check_nonempty("q", q, {1: "H (key heads)", 2: "K (key dim)"})
    check_tensor("k", k, 3, ACTIVATION_DTYPES, dev)
    check_shape("k", k, (n, h, kdim))
    check_tensor("v", v, 3, ACTIVATION_DTYPES, dev)
    if v.shape[0] != n:
        raise InputError(f"v: expected {n} nodes like q, got shape {tuple(v.shape)}")
    check_nonempty("v", v, {1: "HV (value heads)", 2: "V (value dim)"})
    hv, vdim = v.shape[1], v.shape[2]
    if hv % h:
        raise InputError(f"v: {hv} value heads is not a multiple of q/k's {h} key heads")
    for name, t in ((gname, g), (bname, beta)):
        check_tensor(name, t, 2, ACTIVATION_DTYPES, dev)
        check_shape(name, t, (n, hv))
    if gated:
        A_log = contiguous_vector(check_tensor("A_log", A_log, 1, ACTIVATION_DTYPES, dev))
        dt_bias = contiguous_vector(check_tensor("dt_bias", dt_bias, 1, ACTIVATION_DTYPES, dev))
        check_shape("A_log", A_log, (hv,))
        check_shape("dt_bias", dt_bias, (hv,))
    check_tensor("state", state, 4, STATE_DTYPES, dev)
    if tuple(state.shape[1:]) != (hv, vdim, kdim):
        raise InputError(f"state: expected [S, {hv}, {vdim}, {kdim}] (slots, HV, V, K), got {tuple(state.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("state", state)):
        check_last_contiguous(name, t)
    bsz, state_indices, parents, cu_seqlens = check_forest_vectors(state_indices, parents, cu_seqlens, n, dev)
    scale = check_scale(scale, kdim)
    check_flag("use_qk_l2norm", use_qk_l2norm)
    check_flag("check_trees", check_trees)
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int)
                                  or not 1 <= max_nodes <= MAX_TREE_NODES):
        raise InputError(f"max_nodes: expected an int in 1..{MAX_TREE_NODES}, got {max_nodes!r}")
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int)
                                  or not 0 <= max_depth < MAX_TREE_NODES):
        raise InputError(f"max_depth: expected an int in 0..{MAX_TREE_NODES - 1}, got {max_depth!r}")
    if out is not None:
        out = check_out(out, n, hv, vdim, dev)
    check_config("tree_verify", config)
    rows = 0 if pending is None else check_pending(pending, (), state.shape[0], h, kdim, hv, vdim, dev, check_trees)
    if check_trees:
        largest = check_forest(parents, cu_seqlens, n)
        if max_nodes is not None and largest > max_nodes:
            raise InputError(f"max_nodes: {max_nodes} promised, but a request has {largest} nodes")
        max_nodes = largest
        # depths only where they matter: a depth promise to check, or the big-tree launch
        deepest, kinds = (_forest_depths(parents, cu_seqlens)
                          if max_depth is not None or not is_tile_launch({"T": largest}) else (0, None))
        if max_depth is not None and deepest > max_depth:
            raise InputError(f"max_depth: {max_depth} promised, but a node has {deepest} strict ancestors")
        check_pool_slots(state_indices, state.shape[0], check_trees)

    if out is None:
        o = torch.empty_like(v)
        u = torch.empty(n, hv, vdim, device=dev, dtype=torch.float32)
        log_p = torch.empty(n, hv, device=dev, dtype=torch.float32)
    else:
        o, u, log_p = out
    if n == 0 or bsz == 0:
        return VerifyResult(o, u, log_p)

    shape = {"K": kdim, "V": vdim, "HV": hv, "B": bsz, "N": n, "T": max_nodes or 0}
    tile = is_tile_launch(shape)
    if not tile:
        shape["T"] = 0  # the blocked kernel: its rule and tuned buckets go by the mean tree
    cfg = launch_config("tree_verify", shape, config)
    # tf32 dots are well inside bf16/fp16 activations' noise; float32 activations get tf32x3
    # (three tf32 products, about float32's accuracy).
    precision = cfg["precision"] or ("tf32x3" if q.dtype == torch.float32 else "tf32")
    vp = triton.next_power_of_2(vdim)
    kp = triton.next_power_of_2(kdim)
    bv = min(cfg["BV"], vp)
    bk = min(cfg["BK"], kp)
    args = (
        q, k, v, g, beta, A_log if gated else g, dt_bias if gated else g,
        state, state_indices, parents, cu_seqlens, o, u, log_p,
        *(pending if pending is not None else (u, u, u, state_indices)),  # no rows: never read
        scale, state.shape[0], hv,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        state.stride(0), state.stride(1), state.stride(2),
        o.stride(0), o.stride(1), u.stride(0), u.stride(1), log_p.stride(0),
    )
    # 16-bit Gram operands: not under the interpreter, whose 16-bit dots are not exact
    # (and 16-bit dots need a 16-wide inner dimension)
    gram16 = bool(cfg["GRAM16"]) and q.dtype == k.dtype and q.dtype in (torch.bfloat16, torch.float16) \
        and bk >= 16 and not interpreting()
    lp = dict(LP=rows, LPP=max(16, triton.next_power_of_2(rows)))  # LPP: the pending dot's inner dim
    common = dict(GROUP=hv // h, K=kdim, V=vdim, KP=kp, BV=bv, BK=bk, USE_L2NORM=use_qk_l2norm,
                  PRECISION=precision, GATED=gated, GRAM16=gram16, num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"], **lp)
    if tile:
        per_part, parts = value_split(vdim, bv, cfg["VSPLIT"])
        tp = max(16, triton.next_power_of_2(max_nodes))
        tree_verify_tile_kernel[(bsz, hv, parts)](*args, TP=tp, VT=per_part,
                                                  PENDING_AFTER=bool(rows and cfg["PENDING_AFTER"]), **common)
    else:
        tp = _blocked_tp(max_nodes)  # the whole tree's rows sit in registers (the ancestor walk)
        bc = min(cfg["BC"], 64)
        grid = (bsz, hv, triton.cdiv(vdim, bv))
        # Chains of more than CHAIN_KERNEL_DEPTH nodes take the chain kernel, everything else
        # the blocked one after it; the host check or a max_depth promise can rule the chains out.
        if check_trees:
            long_chain, other = kinds
            depth_bound = deepest
        else:
            long_chain = other = max_depth is None or max_depth >= CHAIN_KERNEL_DEPTH
            depth_bound = max_depth
        route = verify_route(cfg, long_chain=long_chain, other=other, depth_bound=depth_bound, rows=rows)
        blocked = dict(BC=bc, NW=tp // 64, TP=tp, DS=CHAIN_KERNEL_DEPTH, SPLIT=route.split, **common)
        if route.chain:
            # its own rule; an explicit config= applies to it too
            chain_cfg = _overridden(chain_launch_config(bsz * hv), config)
            chain_bv = min(chain_cfg.pop("BV"), vp)
            chain = dict(KP=max(16, kp), TP=tp, DS=CHAIN_KERNEL_DEPTH, BV=chain_bv,  # KP: [BC, KP] tl.dot operands
                         GROUP=hv // h, K=kdim, V=vdim, USE_L2NORM=use_qk_l2norm, PRECISION=precision,
                         GATED=gated, **lp, **dict(chain_cfg, BC=min(chain_cfg["BC"], 64)))
            _chain_scan(args, (bsz, hv, triton.cdiv(vdim, chain_bv)), chain)
        if route.levels:
            # shallow trees level by level (tree_verify_levels.py), by its own rule; an
            # explicit config= applies to it too
            level_cfg = _overridden(dict(levels_launch_config(tp), RB=cfg["RB"]), config)
            _levels(args, (bsz, hv, triton.cdiv(vdim, min(level_cfg["BV"], vp))), level_cfg,
                    levels_width(depth_bound), dict(GROUP=hv // h, K=kdim, V=vdim, KP=kp, TP=tp,
                                                    USE_L2NORM=use_qk_l2norm, PRECISION=precision, GATED=gated, **lp))
        if route.blocked:
            _blocked(args, grid, blocked, route.chain)
    return VerifyResult(o, u, log_p)


class VerifyRoute(NamedTuple):
    """Which kernels a launch past one tile runs, in this order (docs/design.md §3)."""

    chain: bool  # the chain kernels, for requests that are long chains
    levels: bool  # the level kernel, for every request (a depth below CHAIN_KERNEL_DEPTH)
    blocked: bool  # the blocked kernel, for every request the chain kernels left
    split: bool  # the blocked kernel's parts in a wide launch first (SPLIT)


def verify_route(cfg: dict, *, long_chain: bool, other: bool, depth_bound: Optional[int], rows: int) -> VerifyRoute:
    """The one choice of kernels past one tile, from the launch config and what is known of
    the trees: whether long chains (`long_chain`) and other requests (`other`) may be
    present, the most strict ancestors of any node (`depth_bound`, None: unknown) and the
    pending rows. The launch and `verify_scratch_bytes` (the plug-in's memory budget) both
    ask this, so they cannot disagree."""
    split = bool(cfg["SPLIT"]) and not rows  # with pending rows: the state products stay inside
    if cfg["CHAIN"] and long_chain:
        return VerifyRoute(True, False, other, split)
    if cfg["LEVELS"] and depth_bound is not None and depth_bound < CHAIN_KERNEL_DEPTH:
        return VerifyRoute(False, True, False, False)
    return VerifyRoute(False, False, True, split)


def _overridden(rule: dict, config: Optional[dict]) -> dict:
    """A kernel's own launch rule with the keys an explicit config= names taken from it."""
    return {key: config[key] if config and key in config else value for key, value in rule.items()}


def _levels(args, grid, level_cfg: dict, dw: int, consts: dict) -> None:
    """The level-by-level verify (tree_verify_levels.py): the ancestors and their products
    per key head, then the levels; the scratch allocated here."""
    a = dict(zip(_BLOCKED_ARGS, args))  # the launch's arguments by name
    bsz, hv, _ = grid
    q, k = a["q"], a["k"]
    n, h = q.shape[0], q.shape[1]
    ancestors, products = (torch.empty(shape, device=q.device, dtype=dtype)
                           for shape, dtype in levels_scratch(n, h, dw))
    kk, qk = products
    tp, rb = consts["TP"], min(level_cfg["RB"], consts["TP"])
    levels_gram_kernel[(bsz, h, dw * (tp // rb))](
        q, k, a["state_idx"], a["parents"], a["cu"], ancestors, kk, qk, a["scale"], a["n_slots"], h,
        a["s_qn"], a["s_qh"], a["s_kn"], a["s_kh"], K=consts["K"], KP=consts["KP"], TP=tp, RB=rb, DW=dw,
        USE_L2NORM=consts["USE_L2NORM"], num_warps=8)
    tree_levels_kernel[grid](
        *args[:_BLOCKED_ARGS.index("pend_n") + 1], ancestors, kk, qk,
        *args[_BLOCKED_ARGS.index("pend_n") + 1:], DW=dw, BV=min(level_cfg["BV"], triton.next_power_of_2(consts["V"])),
        BK=min(level_cfg["BK"], consts["KP"]), num_warps=level_cfg["num_warps"], num_stages=level_cfg["num_stages"],
        **consts)


def _split_workspaces(n: int, bsz: int, h: int, hv: int, vdim: int, tp: int) -> tuple:
    """SPLIT's scratch, ((shape, dtype) of y [N, HV, V], the Gram terms [2, B, H, TP, TP],
    the ancestor words [N, NW]): allocated per launch, reused by the next layer's."""
    return (((n, hv, vdim), torch.float32), ((2, bsz, h, tp, tp), torch.float32), ((n, tp // 64), torch.int64))


def verify_scratch_bytes(n: int, bsz: int, h: int, hv: int, kdim: int, vdim: int, max_nodes: Optional[int],
                         max_depth: Optional[int] = None) -> int:
    """Scratch bytes one tree_verify launch allocates beyond its outputs, for memory budgets
    (`bole bench kernels`' transient bytes, the SGLang plug-in's reserve): the level
    kernel's when the rule takes it (a depth promise below CHAIN_KERNEL_DEPTH), else SPLIT's
    workspaces, and the chain kernels' factors when long chains may be present (max_depth
    None or at least CHAIN_KERNEL_DEPTH); 0 for the one-tile kernel or the whole blocked one
    alone. No pending rows; the launch rules, not config=."""
    shape = {"K": kdim, "V": vdim, "HV": hv, "B": bsz, "N": n, "T": max_nodes or 0}
    if is_tile_launch(shape):
        return 0
    cfg = launch_config("tree_verify", dict(shape, T=0))
    tp = _blocked_tp(max_nodes)
    long_chain = max_depth is None or max_depth >= CHAIN_KERNEL_DEPTH  # as a launch without check_trees
    route = verify_route(cfg, long_chain=long_chain, other=long_chain, depth_bound=max_depth, rows=0)
    if route.levels:
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in levels_scratch(n, h, levels_width(max_depth)))
    total = 0
    if route.blocked and route.split:
        total += sum(math.prod(shape) * dtype.itemsize for shape, dtype in _split_workspaces(n, bsz, h, hv, vdim, tp))
    if route.chain:
        total += math.prod(chain_scratch_shape(bsz, hv, tp, min(chain_launch_config(bsz * hv)["BC"], 64))) * 4
    return total

def _blocked(args, grid, blocked: dict, remainder: bool) -> None:
    """The blocked kernel, after its SPLIT parts (tree_verify_parts.py) when it has them
    (their scratch allocated here, only when they run)."""
    a = dict(zip(_BLOCKED_ARGS, args))  # the launch's arguments by name
    u = a["u"]
    if not blocked["SPLIT"]:  # never read
        _tree_verify_kernel[grid](*args, ys=u, kk_ws=u, qk_ws=u, bits_ws=u, s_yn=0, s_yh=0, REMAINDER=remainder,
                                  **blocked)
        return
    bsz, hv, _ = grid
    q, state, log_p = a["q"], a["state"], a["log_p"]
    tp, h = blocked["TP"], q.shape[1]
    ys, gram, bits = (torch.empty(shape, device=q.device, dtype=dtype)
                      for shape, dtype in _split_workspaces(q.shape[0], bsz, h, hv, blocked["V"], tp))
    # the Gram tiles at least a chunk wide: the tree stage's diagonal blocks lie in written tiles
    bv, bg, roles = PARTS["BV"], min(max(PARTS["BG"], blocked["BC"]), tp), PARTS["ROLES"]
    parts_kernel[(parts_grid(bsz, h, hv, blocked["V"], bv, bg, tp, roles),)](
        q, a["k"], a["g"], a["A_log"], a["dt_bias"], state, a["state_idx"], a["parents"], a["cu"], u, ys, log_p,
        bits, gram[0], gram[1], a["scale"], a["n_slots"], bsz, h, hv,
        a["s_qn"], a["s_qh"], a["s_kn"], a["s_kh"], a["s_gn"], a["s_gh"], state.stride(0), state.stride(1),
        state.stride(2), u.stride(0), u.stride(1), ys.stride(0), ys.stride(1), log_p.stride(0),
        GROUP=blocked["GROUP"], K=blocked["K"], V=blocked["V"], KP=blocked["KP"], BR=PARTS["BR"], BV=bv,
        BK=min(PARTS["BK"], blocked["KP"]), BG=bg, TP=tp, NW=blocked["NW"], DS=blocked["DS"],
        REMAINDER=remainder, USE_L2NORM=blocked["USE_L2NORM"], PRECISION=blocked["PRECISION"],
        GRAM16=blocked["GRAM16"], GATED=blocked["GATED"], ROLES=roles, num_warps=PARTS["num_warps"],
        num_stages=PARTS["num_stages"])
    _tree_verify_kernel[grid](*args, ys=ys, kk_ws=gram[0], qk_ws=gram[1], bits_ws=bits, s_yn=ys.stride(0),
                              s_yh=ys.stride(1), REMAINDER=remainder, **blocked)


def _chain_scan(args, grid, chain: dict) -> None:
    """The chain verify (tree_verify_chain.py): the chunk factors for every (request, value
    head, chunk), then the scan; the factors' scratch allocated here."""
    a = dict(zip(_BLOCKED_ARGS, args))  # the launch's arguments by name
    bsz, hv, _ = grid
    q, k, log_p = a["q"], a["k"], a["log_p"]
    bc, tp = chain["BC"], chain["TP"]
    fu, fo = torch.empty(chain_scratch_shape(bsz, hv, tp, bc), device=q.device, dtype=torch.float32)
    consts = {key: chain[key] for key in ("GROUP", "K", "KP", "BC", "TP", "DS", "USE_L2NORM", "PRECISION", "GATED")}
    chain_factors_kernel[(bsz, hv, tp // bc)](
        q, k, a["g"], a["beta"], a["A_log"], a["dt_bias"], a["state_idx"], a["parents"], a["cu"], log_p, fu, fo,
        a["scale"], a["n_slots"], hv, a["s_qn"], a["s_qh"], a["s_kn"], a["s_kh"], a["s_gn"], a["s_gh"],
        a["s_bn"], a["s_bh"], a["s_ln"], num_warps=4, **consts)
    chain_scan_kernel[grid](
        q, k, a["v"], a["g"], a["beta"], a["A_log"], a["dt_bias"], a["state"], a["state_idx"], a["parents"], a["cu"],
        a["o"], a["u"], fu, fo, a["pend_k"], a["pend_u"], a["pend_lp"], a["pend_n"], a["scale"], a["n_slots"], hv,
        a["s_qn"], a["s_qh"], a["s_kn"], a["s_kh"], a["s_vn"], a["s_vh"], a["s_gn"], a["s_gh"], a["s_bn"], a["s_bh"],
        a["s_sn"], a["s_sh"], a["s_sv"], a["s_on"], a["s_oh"], a["s_un"], a["s_uh"],
        V=chain["V"], BV=chain["BV"], LP=chain["LP"], LPP=chain["LPP"], num_warps=chain["num_warps"],
        num_stages=chain["num_stages"], **consts)


def _forest_depths(parents: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[int, tuple[bool, bool]]:
    """Host read (check_trees only): (the most strict ancestors of any node, (whether some
    request is a chain of more than CHAIN_KERNEL_DEPTH nodes: the chain kernel, whether some other
    request is not: the blocked kernel)). Depths by pointer jumping, log2(depth) steps."""
    par = parents.detach().to("cpu", torch.int64)
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if par.numel() == 0:
        return 0, (False, False)
    sizes = cu[1:] - cu[:-1]
    first = torch.repeat_interleave(cu[:-1], sizes)
    local = torch.arange(par.numel()) - first
    ptr = torch.where(par >= 0, par + first, torch.full_like(par, -1))
    dist = (ptr >= 0).to(torch.int64)  # levels from each node up to where ptr points
    while bool((ptr >= 0).any()):
        live = ptr >= 0
        safe = ptr.clamp_min(0)
        dist = dist + torch.where(live, dist[safe], 0)
        ptr = torch.where(live, ptr[safe], ptr)
    req = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    counts = torch.zeros(sizes.numel(), dtype=torch.int64)
    not_chain = counts.index_add(0, req, (par != local - 1).to(torch.int64)) > 0
    deep = counts.index_add(0, req, (dist >= CHAIN_KERNEL_DEPTH).to(torch.int64)) > 0
    long_chain = ~not_chain & deep & (sizes > 0)
    return int(dist.max()), (bool(long_chain.any()), bool((~long_chain & (sizes > 0)).any()))
