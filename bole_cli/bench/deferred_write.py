"""The deferred write on chains, as `bole bench kernels` times it beside SGLang's ReplaySSM
ring (docs/design.md §2 "Deferred write"; the bookkeeping in kernels/pending_chain.py).

The served step reads a request's state in the verify and reads and writes it in the
commit, every step; the ring reads its checkpoint and writes the state only when its
history is full, which is why it wins on short chains at large batches (experiments/
NOTES.md "Replay commit, node by node"). Here a request's accepted rows stay in its
segment of the forest as a chain above the next draft, the verify (unchanged) reads them
from the unwritten state, and the replay commit folds them in when the next draft would
not fit. Measured on an H100 it loses to the ring (experiments/README.md S5-a, S5-b).
A segment holds as many rows as the ring (`deferred_width`), so both keep the same history.

A step, one GDN layer: `PendingChains.verify` (place the draft, the verify over the static
segment forest, gather the drafts' outputs) and `PendingChains.commit` (advance the counts,
the replay commit folding the requests that are due). kernel_bench.deferred_agreement
checks it against the served step over enough consecutive steps that every request folds.
"""

from __future__ import annotations

from typing import Optional

from bole_cli.limits import MAX_TILE_NODES


def deferred_width(nodes: int) -> Optional[int]:
    """The segment for chains of `nodes`: the ring's length (`ring_len_for`, the rows the
    ring holds a request), or None where it leaves no room for a pending row or passes the
    one-tile verify (MAX_TILE_NODES)."""
    from bole_cli.sglang.baseline_kernels import ring_len_for

    width = ring_len_for(nodes)
    return width if nodes < width <= MAX_TILE_NODES else None


class PendingChains:
    """One layer's deferred write for one input set (LayerInputs of chains): the segments,
    their static chain forest, the pending counts, and the state pool and slots of the set,
    which hold each request's state as of its last fold. A, dt_bias are the set's (a layer's
    gate parameters never change between steps: the pending rows' gates are recomputed)."""

    def __init__(self, torch, s, width: int, config: Optional[dict] = None):
        from bole_cli.errors import InputError
        from bole_cli.kernels.types import DraftRows, VerifyResult

        batch, nodes = s.batch, s.nodes
        dev = s.q.device
        if not nodes < width <= MAX_TILE_NODES:
            raise InputError(f"width: {width} must exceed the draft's {nodes} nodes and be at most {MAX_TILE_NODES}")
        chain = torch.arange(-1, nodes - 1, dtype=s.parents.dtype, device=dev).repeat(batch)
        if not torch.equal(s.parents, chain):
            raise InputError("parents: the deferred write takes chains only (a tree's accepted path would "
                             "have to be compacted inside the segment first)")
        self.s, self.width, self.config, self.nodes = s, width, config, nodes
        self.draft = DraftRows(s.q, s.k, s.v, s.a, s.b)
        self.segment = DraftRows(*(torch.zeros((batch * width,) + t.shape[1:], dtype=t.dtype, device=dev)
                                   for t in self.draft))
        self.parents = torch.arange(-1, width - 1, dtype=torch.int32, device=dev).repeat(batch)
        self.cu = torch.arange(0, batch * width + 1, width, dtype=torch.int32, device=dev)
        self.pending = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.rows = torch.empty(batch * nodes, dtype=torch.int64, device=dev)
        self.fold = torch.full((batch,), -1, dtype=torch.int32, device=dev)
        self.out = VerifyResult.like(self.segment.v)
        self.o = torch.empty_like(s.v)  # the drafts' outputs, packed as the draft

    def verify(self, torch, kernels, draft=None) -> None:
        """Place the draft (the set's, or `draft`) after each request's pending rows, verify
        the segment forest from the pool, and gather the drafts' outputs into self.o."""
        from bole_cli.kernels.pending_chain import pending_place

        s = self.s
        pending_place(self.segment, draft or self.draft, self.pending, self.rows, check_trees=False)
        kernels.tree_verify_gated(*self.segment, s.A_log, s.dt_bias, s.pool, s.slots, self.parents, self.cu,
                                  check_trees=False, max_nodes=self.width, max_depth=self.width - 1, out=self.out,
                                  config=self.config, factors=False)
        torch.index_select(self.out.o, 0, self.rows, out=self.o)

    def commit(self, kernels, accepted) -> None:
        """Advance the counts by the accepted draft nodes and fold the requests that are due."""
        from bole_cli.kernels.pending_chain import pending_advance

        pending_advance(self.pending, accepted, self.fold, draft_nodes=self.nodes, width=self.width,
                        check_trees=False)
        self.fold_into(kernels, self.s.pool, self.fold)

    def settled(self, kernels):
        """The committed state: a copy of the pool with every pending row folded in."""
        pool = self.s.pool.clone()
        self.fold_into(kernels, pool, self.pending - 1)
        return pool

    def fold_into(self, kernels, pool, fold) -> None:
        """The replay commit on the segment forest: each request's rows up to fold[b] (its
        forest-local node, -1 for none) folded into `pool` at its slot."""
        s, seg = self.s, self.segment
        kernels.tree_commit_replay_gated(pool, s.slots, seg.k, seg.v, seg.a, seg.b, s.A_log, s.dt_bias,
                                         self.parents, self.cu, fold, check_trees=False, max_nodes=self.width,
                                         max_depth=self.width - 1)

