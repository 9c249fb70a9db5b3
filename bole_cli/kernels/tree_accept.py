"""The accepted path of every request through its drafted tree, in one launch: a tree step's
sample phase after the target's argmax (docs/design.md §8).

Written as fixed-shape torch ops (bench/e2e/device_walk.py, this kernel's reference) the walk
is twenty to thirty small launches a tree level, 0.1-0.25 ms of a step at depth 3-8 on an H100
(experiments/NOTES.md "The sample phase in one launch"); a serving engine walks the tree in
one kernel, as SGLang's greedy tree verify does. Here one program takes one request and
follows its tree level by level, a few dependent loads a level:

- greedy (`ranks` None): below each accepted node, the first kept child by rank whose
  drafted token is the target's token at that node;
- ranked: the child of the rank drawn for that level, `ranks[step, b, level]` (-1: none),
  the step's row picked on the device (`step` [1], clamped to the table), so the launch is
  captured once and replayed every step.

Tables (one tree layout for the batch, each request keeping some of its nodes): `rows` [B, L]
a layout node's packed row in the step's nodes, or -1 where the request's budget cut it;
`children` [L, K] a node's child by rank (layout ids), or -1; `start` [B] each request's
first packed row. Outputs: `accepted` [B] the deepest accepted node's local index (0: the
root), `out` [B, depth + 2]: column 0 the committed count (accepted drafts + the bonus), then
the drafts' tokens and the bonus token (the target's at the accepted node). As the reference
leaves them, the columns past the bonus hold the deepest accepted node's drafted token (the
root's when none was accepted) and the last column 0; every column is written, so a reused
buffer keeps nothing of an earlier step.

Whatever the tables say, the kernel reads and writes only inside its arguments: a child
outside 0..L-1, a row outside 0..N-1 or a rank outside 0..K-1 is no child, and a request
whose root row is outside the nodes commits nothing (count 0, accepted -1).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import INDEX_DTYPES, check_shape, check_tensor


@triton.jit
def _tree_accept_kernel(target, tokens, rows, children, start, ranks, step, accepted, out,
                        n_nodes, n_layout, n_steps, n_req, depth,
                        K: tl.constexpr, KP: tl.constexpr, GREEDY: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ar = tl.arange(0, KP)
    width = depth + 2
    row = tl.load(rows + b * n_layout).to(tl.int64)  # the root's packed row
    root_ok = (row >= 0) & (row < n_nodes)
    row = tl.where(root_ok, row, 0)
    node = b * 0  # layout id 0: the root
    count = b * 0
    alive = root_ok
    if not GREEDY:
        s = tl.load(step).to(tl.int64)
        s = tl.minimum(tl.maximum(s, 0), n_steps - 1)
        draws = ranks + (s * n_req + b) * depth
    for lvl in range(0, depth):
        kids = tl.load(children + node * K + ar, mask=ar < K, other=-1).to(tl.int64)
        kid_ok = (kids >= 0) & (kids < n_layout)
        kid_rows = tl.load(rows + b * n_layout + kids, mask=kid_ok, other=-1).to(tl.int64)
        kept = kid_ok & (kid_rows >= 0) & (kid_rows < n_nodes)
        if GREEDY:
            want = tl.load(target + row, mask=root_ok, other=0).to(tl.int64)
            drafted = tl.load(tokens + kid_rows, mask=kept, other=0).to(tl.int64)
            first = tl.min(tl.where(kept & (drafted == want), ar, KP), axis=0)
            rank = tl.where(first < KP, first, -1).to(tl.int64)
        else:
            rank = tl.load(draws + lvl).to(tl.int64)
        pick = kept & (ar == rank)
        ok = alive & (tl.sum(pick.to(tl.int32), axis=0) > 0)
        node = tl.where(ok, tl.sum(tl.where(pick, kids, 0), axis=0), node)
        row = tl.where(ok, tl.sum(tl.where(pick, kid_rows, 0), axis=0), row)
        tok = tl.load(tokens + row, mask=root_ok, other=0).to(tl.int64)
        tl.store(out + b * width + lvl + 1, tok)  # 0 for a root outside the nodes
        count += ok.to(tl.int64)
        alive = ok
    bonus = tl.load(target + row, mask=root_ok, other=0).to(tl.int64)
    tl.store(out + b * width + depth + 1, tl.where(root_ok & (count == depth), bonus, 0))
    tl.store(out + b * width + count + 1, bonus, mask=root_ok & (count < depth))
    tl.store(out + b * width, tl.where(root_ok, count + 1, 0))
    first_row = tl.load(start + b).to(tl.int64)
    tl.store(accepted + b, tl.where(root_ok, row - first_row, -1))


def tree_accept(target: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor, children: torch.Tensor,
                start: torch.Tensor, *, depth: int, ranks: Optional[torch.Tensor] = None,
                step: Optional[torch.Tensor] = None, accepted: Optional[torch.Tensor] = None,
                out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """target [N], tokens [N]: the target's and the drafter's token at every packed node;
    rows [B, L], children [L, K], start [B] (module docstring); depth: the levels walked;
    ranks [S, B, depth] and step [1] for a ranked walk, neither for a greedy one.
    Returns (accepted [B], out [B, depth + 2]) int64, written into `accepted` / `out` when
    given (a captured graph's buffers). Checks shapes, dtypes and devices, never contents."""
    target = check_tensor("target", target, 1, INDEX_DTYPES)
    dev = target.device
    tokens = check_tensor("tokens", tokens, 1, INDEX_DTYPES, dev)
    check_shape("tokens", tokens, tuple(target.shape))
    rows = check_tensor("rows", rows, 2, INDEX_DTYPES, dev)
    children = check_tensor("children", children, 2, INDEX_DTYPES, dev)
    bsz, n_layout = rows.shape
    if n_layout == 0:
        raise InputError("rows: no layout nodes (node 0 is every request's root)")
    if children.shape[0] != n_layout:
        raise InputError(f"children: {children.shape[0]} layout nodes, rows has {n_layout}")
    start = check_tensor("start", start, 1, INDEX_DTYPES, dev)
    check_shape("start", start, (bsz,))
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise InputError(f"depth: expected a non-negative integer, got {depth!r}")
    if (ranks is None) != (step is None):
        raise InputError("ranks and step: give both (a ranked walk) or neither (a greedy walk)")
    if ranks is not None:
        ranks = check_tensor("ranks", ranks, 3, INDEX_DTYPES, dev)
        if ranks.shape[0] < 1:
            raise InputError("ranks: no step's draws")
        check_shape("ranks", ranks, (ranks.shape[0], bsz, depth))
        step = check_tensor("step", step, 1, INDEX_DTYPES, dev)
        check_shape("step", step, (1,))
    if accepted is None:
        accepted = torch.empty(bsz, dtype=torch.int64, device=dev)
    if out is None:  # every column is written
        out = torch.empty(bsz, depth + 2, dtype=torch.int64, device=dev)
    check_tensor("accepted", accepted, 1, (torch.int64,), dev)
    check_shape("accepted", accepted, (bsz,))
    check_tensor("out", out, 2, (torch.int64,), dev)
    check_shape("out", out, (bsz, depth + 2))
    if bsz == 0:
        return accepted, out
    for name, t in (("accepted", accepted), ("out", out)):
        if not t.is_contiguous():
            raise InputError(f"{name}: must be contiguous (the kernel writes it as raw memory)")
    target, tokens, rows, children, start = (t.contiguous() for t in (target, tokens, rows, children, start))
    k = children.shape[1]
    greedy = ranks is None
    ranks_arg = start if greedy else ranks.contiguous()
    step_arg = start if greedy else step
    _tree_accept_kernel[(bsz,)](target, tokens, rows, children, start, ranks_arg, step_arg, accepted, out,
                                target.shape[0], n_layout, 1 if greedy else ranks.shape[0], bsz, depth,
                                K=k, KP=triton.next_power_of_2(max(k, 1)), GREEDY=greedy, num_warps=1)
    return accepted, out
