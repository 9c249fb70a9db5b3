"""A packed batch of proposal trees: exactly the kernels' tree arrays (docs/design.md §3).

``parents[N]`` int32 local to each request and ``cu_seqlens[B+1]`` int32; request b owns
nodes ``cu_seqlens[b]:cu_seqlens[b+1]``. Pure Python: torch only inside ``to_torch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from bole_cli.errors import InputError
from bole_cli.trees.tree import ProposalTree


@dataclass(frozen=True)
class Forest:
    """Many requests' trees packed back to back: the kernels' tree arrays.

    ``parents`` are local to each request; request b owns nodes
    ``cu_seqlens[b]:cu_seqlens[b+1]`` (a request may own none after budget selection).
    """

    parents: tuple[int, ...]
    cu_seqlens: tuple[int, ...]
    depths: tuple[int, ...]  # per node, as ProposalTree.depths
    log_probs: tuple[float, ...]

    @property
    def batch_size(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def n_nodes(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def sizes(self) -> tuple[int, ...]:
        c = self.cu_seqlens
        return tuple(c[b + 1] - c[b] for b in range(self.batch_size))

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def request(self, b: int) -> slice:
        return slice(self.cu_seqlens[b], self.cu_seqlens[b + 1])

    def tree(self, b: int) -> Optional[ProposalTree]:
        """Request b's tree, or None when it owns no nodes."""
        s = self.request(b)
        if s.start == s.stop:
            return None
        return ProposalTree(self.parents[s], self.log_probs[s])

    def to_torch(self, device: Any = "cpu"):
        """(parents, cu_seqlens) as int32 tensors on `device`, ready for tree_verify."""
        import torch

        return (torch.tensor(self.parents, dtype=torch.int32, device=device),
                torch.tensor(self.cu_seqlens, dtype=torch.int32, device=device))

    def to_dict(self) -> dict[str, Any]:
        return {"parents": list(self.parents), "cu_seqlens": list(self.cu_seqlens),
                "depths": list(self.depths), "log_probs": list(self.log_probs)}


def pack_segments(segments: Sequence[Optional[ProposalTree]]) -> Forest:
    """Pack per-request trees back to back; None is a request that keeps no nodes
    (budget selection can leave one empty). No checks: see pack_forest."""
    parents: list[int] = []
    depths: list[int] = []
    log_probs: list[float] = []
    cu = [0]
    for t in segments:
        if t is not None:
            parents.extend(t.parents)
            depths.extend(t.depths)
            log_probs.extend(t.log_probs)
        cu.append(len(parents))
    return Forest(tuple(parents), tuple(cu), tuple(depths), tuple(log_probs))


def check_batch(trees: Sequence[ProposalTree], purpose: str) -> list[ProposalTree]:
    """A non-empty list of ProposalTrees (one per request), or a clear error."""
    trees = list(trees)
    if not trees:
        raise InputError(f"batch is empty: no trees to {purpose}")
    for b, t in enumerate(trees):
        if not isinstance(t, ProposalTree):
            raise TypeError(f"request {b}: expected a ProposalTree, got {type(t).__name__}")
    return trees


def pack_forest(trees: Sequence[ProposalTree]) -> Forest:
    """Pack a batch of trees into the kernels' flat arrays (parents stay local)."""
    return pack_segments(check_batch(trees, "pack"))

