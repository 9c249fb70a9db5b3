"""The deferred write's bookkeeping (docs/design.md §2, "Deferred write"): a request's
accepted rows wait in its segment of the packed forest as a chain above the next draft,
and its state is written only when the segment is full.

Each request owns a fixed segment of `width` rows of the GDN inputs (q, k, v, a, b) in a
forest whose parents are one static chain per segment. Its first `pending` rows are the
accepted path since its state was last written (read from the unwritten state, the closed
form treats them as the draft's ancestors, exactly); the draft goes right after them, and
the rows past the draft are stale descendants whose outputs nobody reads (they must be
finite: the verify's products mix every row of a request, so a NaN left there by an earlier
draft would reach the draft's outputs until a later draft overwrites it). So the verify
runs unchanged on a static forest, a chain's accepted rows are already in place (nothing
is copied to keep them), and the replay commit, launched on the same forest, folds the
whole pending chain plus the accepted drafts into the state when the next draft would not
fit: the ring's protocol (SGLang's ReplaySSM checkpoint) on the replay commit's raw rows.

Two launches a step beside the verify and the commit:
- `pending_place`: the draft's rows into each segment after its pending rows, and each
  draft row's forest row (for gathering the drafts' outputs);
- `pending_advance`: from the accepted node, the node the replay commit folds (-1: none)
  and the pending count of the next step.
Reference: `reference.pending_place_ref`, `reference.pending_advance_ref`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.types import DraftRows
from bole_cli.kernels.validate import ACTIVATION_DTYPES, check_index_vector, check_tensor

ADVANCE_BLOCK = 1024


@triton.jit
def _copy_row(src, dst, src_row, dst_row, s_src, s_dst, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < WIDTH
    tl.store(dst + dst_row * s_dst + offs, tl.load(src + src_row * s_src + offs, mask=m), mask=m)


@triton.jit
def _pending_place_kernel(q, k, v, a, b, sq, sk, sv, sa, sb, pending, rows,
                          s_q, s_k, s_v, s_a, s_b, s_sq, s_sk, s_sv, s_sa, s_sb,
                          C: tl.constexpr, W: tl.constexpr, WQK: tl.constexpr, WV: tl.constexpr,
                          WG: tl.constexpr, BQK: tl.constexpr, BV: tl.constexpr, BG: tl.constexpr):
    """Program r: draft row r (request r // C, node r % C) to its segment's row pending + node."""
    r = tl.program_id(0).to(tl.int64)
    req = r // C
    p = tl.load(pending + req).to(tl.int64)
    p = tl.minimum(tl.maximum(p, 0), W - C)  # a count outside the segment: its nearest place
    dst = req * W + p + r % C
    _copy_row(q, sq, r, dst, s_q, s_sq, WQK, BQK)
    _copy_row(k, sk, r, dst, s_k, s_sk, WQK, BQK)
    _copy_row(v, sv, r, dst, s_v, s_sv, WV, BV)
    _copy_row(a, sa, r, dst, s_a, s_sa, WG, BG)
    _copy_row(b, sb, r, dst, s_b, s_sb, WG, BG)
    tl.store(rows + r, dst)


@triton.jit
def _pending_advance_kernel(pending, accepted, fold, n_req, C: tl.constexpr, W: tl.constexpr,
                            BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n_req
    p = tl.load(pending + offs, mask=m, other=0).to(tl.int64)  # clamped before any narrowing
    p = tl.minimum(tl.maximum(p, 0), W - C)
    a = tl.load(accepted + offs, mask=m, other=-1).to(tl.int64)
    a = tl.where((a >= -1) & (a < C), a, -1)  # an accepted node outside the draft commits nothing
    held = p + a + 1  # pending rows after this step's accepted ones
    due = held + C > W  # the next draft would not fit: fold them all into the state now
    tl.store(fold + offs, tl.where(due, held - 1, -1).to(fold.dtype.element_ty), mask=m)
    tl.store(pending + offs, tl.where(due, 0, held).to(pending.dtype.element_ty), mask=m)


def _rows_2d(name: str, t: torch.Tensor, dims: int, device) -> torch.Tensor:
    """t [N, ...] as [N, width] rows without a copy (the trailing dimensions contiguous)."""
    check_tensor(name, t, dims, ACTIVATION_DTYPES, device)
    width = math.prod(t.shape[1:])
    if t.shape[0] == 0:
        return t.reshape(0, width)
    if not t[0].is_contiguous():
        raise InputError(f"{name}: each row must be contiguous (strides {t.stride()})")
    return t.view(t.shape[0], width)


def _check_rows(name: str, rows: DraftRows, device) -> list[torch.Tensor]:
    """q, k [N, H, K], v [N, HV, V], a, b [N, HV] of one row count and dtype, as [N, width] views."""
    flat = [_rows_2d(f"{name}.{f}", t, d, device) for f, t, d in zip(DraftRows._fields, rows, (3, 3, 3, 2, 2))]
    q, k, v, a, b = rows
    for f, t, want in (("k", k, q.shape), ("v", v, (q.shape[0],) + tuple(v.shape[1:])),
                       ("a", a, (q.shape[0], v.shape[1])), ("b", b, (q.shape[0], v.shape[1]))):
        if tuple(t.shape) != tuple(want) or t.dtype != q.dtype:
            raise InputError(f"{name}.{f}: expected {tuple(want)} {q.dtype} like {name}.q and {name}.v, got "
                             f"{tuple(t.shape)} {t.dtype}")
    return flat


def _check_counts(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """Host read: every value in low..high, else one InputError naming the first request outside."""
    host = values.cpu()
    bad = (host < low) | (host > high)
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise InputError(f"{name}: request {b} has {int(host[b])}, outside {low}..{high}")


def pending_place(segment: DraftRows, draft: DraftRows, pending: torch.Tensor, rows: torch.Tensor, *,
                  check_trees: bool = True) -> None:
    """Copy each request's draft rows into its segment after its pending rows.

    segment: DraftRows of [B * width, ...] tensors (q, k [., H, K]; v [., HV, V]; a, b
    [., HV]); draft: the same of [B * C, ...] (C draft rows a request, C <= width), dtypes
    and trailing shapes equal to the segment's. pending [B] (int32/int64): rows already in
    each segment, in 0..width - C. rows [B * C] int64 (written): the forest row of each
    draft row, to gather the drafts' outputs. With check_trees, a pending count outside
    0..width - C is an InputError (a host read); without it (CUDA graphs) it is clamped
    there, so no write leaves the request's segment."""
    dev = pending.device
    check_tensor("pending", pending, 1, (torch.int32, torch.int64), dev)
    bsz = pending.shape[0]
    pending = check_index_vector("pending", pending, bsz, dev)
    seg, src = _check_rows("segment", segment, dev), _check_rows("draft", draft, dev)
    if segment.q.shape[1:] != draft.q.shape[1:] or segment.v.shape[1:] != draft.v.shape[1:] \
            or segment.q.dtype != draft.q.dtype:
        raise InputError(f"draft: q {tuple(draft.q.shape)} and v {tuple(draft.v.shape)} ({draft.q.dtype}) do not "
                         f"match the segment's rows (q {tuple(segment.q.shape)}, v {tuple(segment.v.shape)}, "
                         f"{segment.q.dtype})")
    if bsz == 0:
        return
    for name, n in (("segment", seg[0].shape[0]), ("draft", src[0].shape[0])):
        if n % bsz:
            raise InputError(f"{name}: {n} rows are not a multiple of the {bsz} requests")
    width, nodes = seg[0].shape[0] // bsz, src[0].shape[0] // bsz
    if not 1 <= nodes <= width:
        raise InputError(f"draft: {nodes} rows a request does not fit a segment of {width}")
    check_tensor("rows", rows, 1, (torch.int64,), dev)
    if rows.shape[0] != bsz * nodes or not rows.is_contiguous():
        raise InputError(f"rows: expected a contiguous int64 vector of {bsz * nodes}, got shape {tuple(rows.shape)}")
    if check_trees:
        _check_counts("pending", pending, 0, width - nodes)
    wqk, wv, wg = seg[0].shape[1], seg[2].shape[1], seg[3].shape[1]
    _pending_place_kernel[(bsz * nodes,)](
        *src, *seg, pending, rows, *(t.stride(0) for t in src), *(s.stride(0) for s in seg),
        C=nodes, W=width, WQK=wqk, WV=wv, WG=wg, BQK=triton.next_power_of_2(wqk),
        BV=triton.next_power_of_2(wv), BG=triton.next_power_of_2(wg), num_warps=4)


def pending_advance(pending: torch.Tensor, accepted: torch.Tensor, fold: torch.Tensor, *, draft_nodes: int,
                    width: int, check_trees: bool = True) -> None:
    """After sampling: fold[b] = the forest-local node the replay commit folds into request
    b's state (its pending rows and accepted drafts, when the next draft of `draft_nodes`
    would not fit its segment of `width`), else -1; pending[b] (in place) = the rows its
    segment holds for the next step (0 after a fold).

    accepted [B]: the accepted draft node, -1 for none. With check_trees, one outside -1..C -
    1 or a pending count outside 0..width - C is an InputError; without it (CUDA graphs)
    such an accepted node commits nothing and the count is clamped."""
    dev = pending.device
    check_tensor("pending", pending, 1, (torch.int32, torch.int64), dev)
    if not pending.is_contiguous():
        raise InputError("pending: must be contiguous (it is updated in place)")
    bsz = pending.shape[0]
    accepted = check_index_vector("accepted", accepted, bsz, dev)
    check_tensor("fold", fold, 1, (torch.int32, torch.int64), dev)
    if fold.shape[0] != bsz or not fold.is_contiguous():
        raise InputError(f"fold: expected a contiguous vector of {bsz}, got shape {tuple(fold.shape)}")
    for name, value in (("draft_nodes", draft_nodes), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name}: expected a positive int, got {value!r}")
    if draft_nodes > width:
        raise InputError(f"draft_nodes: {draft_nodes} does not fit a segment of width {width}")
    if bsz == 0:
        return
    if check_trees:
        _check_counts("pending", pending, 0, width - draft_nodes)
        _check_counts("accepted", accepted, -1, draft_nodes - 1)
    _pending_advance_kernel[(triton.cdiv(bsz, ADVANCE_BLOCK),)](
        pending, accepted, fold, bsz, C=draft_nodes, W=width, BLOCK=ADVANCE_BLOCK, num_warps=4)
