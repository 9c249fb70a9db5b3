"""The accepted path of every request, found on the device (the sample phase of a tree step).

A serving engine samples on the GPU and hands back only the accepted tokens: one host sync
a step (docs/design.md §8). `DeviceWalk` is that walk for `bole bench e2e`'s trees: on CUDA
one launch of kernels.tree_accept, elsewhere fixed-shape torch ops (the kernel's reference,
twenty to thirty launches a level); either is captured in a CUDA graph. Both accept exactly
what simulated_acceptance's host walks accept (CPU tests hold the three equal):

- greedy: below each accepted node, the first kept child (by rank) whose drafted token is
  the target's argmax at that node;
- simulated: below each accepted node, the rank that one uniform draw picks (or none).
  The draws are the host walk's own (step_rng per request and step), turned into ranks
  before the run (`ranks`), one per level: the walk reads level d's draw only when it
  reaches depth d, as the host walk draws it only then, so the two agree.

Outputs (`sample`): accepted [B] local index of the deepest accepted node (0 = the root),
and tokens [B, depth + 2]: column 0 the committed count (accepted drafts + the bonus), then
the accepted drafts' tokens and the bonus token (the target's argmax at the accepted node).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from bole_cli.bench.e2e.simulated_acceptance import step_rng
from bole_cli.bench.e2e.tree_budget import TreePlan


def simulated_ranks(q: Sequence[Sequence[float]], topk: int, depth: int, seed: int, batch: int,
                    steps: int) -> list[list[list[int]]]:
    """[step][request][level]: the rank that level's draw picks (-1: none), from the draws
    walk_simulated makes (one uniform a level, in order, per (seed, request, step))."""
    out = []
    for step in range(steps):
        rows = []
        for b in range(batch):
            rng = step_rng(seed, b, step)
            ranks = []
            for d in range(depth):
                u, acc, rank = rng.random(), 0.0, -1
                for r, p in enumerate(q[d][:topk]):
                    acc += p  # the host walk's own sum, in its order: the same thresholds
                    if u < acc:
                        rank = r
                        break
                ranks.append(rank)
            rows.append(ranks)
        out.append(rows)
    return out


class DeviceWalk:
    """One plan's walk tables on the device; `sample` is capturable (no host read).

    greedy: accept by the target's tokens; else `ranks` [steps, B, depth] (simulated_ranks)
    and a device step counter, advanced by `advance` in the commit's graph."""

    def __init__(self, plan: TreePlan, device: torch.device, *, greedy: bool,
                 ranks: "list[list[list[int]]] | None" = None):
        lay = plan.layout
        bsz, n_layout, k = plan.batch, lay.n_nodes, lay.topk
        cu = plan.forest.cu_seqlens
        rows = torch.full((bsz, n_layout), -1, dtype=torch.int64)
        for b, kept in enumerate(plan.local):
            if kept.get(0) != 0:
                raise ValueError(f"request {b} does not keep its root as local node 0: nothing to walk from")
            for node, local in kept.items():
                rows[b, node] = cu[b] + local
        children = torch.full((n_layout, k), -1, dtype=torch.int64)
        for node, kids in enumerate(lay.children):
            for r, c in enumerate(kids):
                children[node, r] = c
        self.depth, self.batch, self.greedy = lay.depth, bsz, greedy
        self.rows = rows.to(device)  # [B, layout nodes] packed row of a kept node, or -1
        self.children = children.to(device)  # [layout nodes, k] layout id by rank, or -1
        self.start = torch.tensor(list(cu[:-1]), dtype=torch.int64, device=device)
        if not greedy:
            if ranks is None:
                raise ValueError("a simulated walk needs its ranks")
            self.ranks = torch.tensor(ranks, dtype=torch.int64, device=device).view(-1, bsz, lay.depth)
            self.step = torch.zeros(1, dtype=torch.int64, device=device)
            self.steps = self.ranks.shape[0]

    def _child(self, node: torch.Tensor, rank: torch.Tensor):
        """(layout id, packed row, kept) of each request's rank-`rank` child of `node`."""
        kid = self.children.index_select(0, node).gather(1, rank.clamp(min=0)[:, None])[:, 0]
        row = self.rows.gather(1, kid.clamp(min=0)[:, None])[:, 0]
        return kid, row, (rank >= 0) & (kid >= 0) & (row >= 0)

    def sample(self, target: torch.Tensor, tokens: torch.Tensor, *,
               kernel: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """target [N] the target's argmax at every packed node; tokens [N] the drafted tokens.
        Returns (accepted [B] local index, tokens [B, depth + 2]: count, drafts, bonus).
        kernel: one launch of kernels.tree_accept (default on CUDA) or the torch ops."""
        use_kernel = target.is_cuda if kernel is None else kernel
        if use_kernel:
            from bole_cli.kernels.tree_accept import tree_accept

            return tree_accept(target, tokens, self.rows, self.children, self.start, depth=self.depth,
                               ranks=None if self.greedy else self.ranks,
                               step=None if self.greedy else self.step)
        bsz, dev = self.batch, target.device
        node = torch.zeros(bsz, dtype=torch.int64, device=dev)  # layout id 0: the root
        row = self.rows[:, 0]
        alive = torch.ones(bsz, dtype=torch.bool, device=dev)
        count = torch.zeros(bsz, dtype=torch.int64, device=dev)
        out = torch.zeros(bsz, self.depth + 2, dtype=torch.int64, device=dev)
        if not self.greedy:
            draws = self.ranks.index_select(0, self.step.clamp(max=self.steps - 1))[0]  # [B, depth]
        for lvl in range(self.depth):
            if self.greedy:
                kids = self.children.index_select(0, node)  # [B, k]
                kid_rows = self.rows.gather(1, kids.clamp(min=0))
                kept = (kids >= 0) & (kid_rows >= 0)
                want = target.index_select(0, row)
                match = kept & (tokens.index_select(0, kid_rows.clamp(min=0).view(-1)).view_as(kids)
                                == want[:, None])
                rank = torch.where(match.any(1), match.to(torch.int8).argmax(1).to(torch.int64), -1)
            else:
                rank = draws[:, lvl]
            kid, kid_row, ok = self._child(node, rank)
            ok &= alive
            node, row = torch.where(ok, kid, node), torch.where(ok, kid_row, row)
            out[:, lvl + 1] = tokens.index_select(0, row)  # past the path: overwritten or unread
            count += ok
            alive = ok
        out.scatter_(1, (count + 1)[:, None], target.index_select(0, row)[:, None])
        out[:, 0] = count + 1
        return row - self.start, out

    def advance(self) -> None:
        """The next step's draws (simulated; in the commit's graph)."""
        if not self.greedy:
            self.step.add_(1)
