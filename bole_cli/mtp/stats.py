"""From per-anchor ranks to the acceptance matrix q[d][r], with intervals (docs/design.md §8).

q[d][r] = counts[d][r] / trials[d]: trials[d] counts the anchors whose target tokens at
depths 1..d-1 were all among the draft's top-k (so a tree holding every top-k candidate
would have reached depth d), counts[d][r] those whose depth-d token had rank r. Summed over
ranks this is exactly the fraction of anchors a full top-k tree accepts to depth d; a chain
(rank 1 at every depth) is also tallied on its own, since its acceptance can differ from the
rank-1 column of q when ranks at successive depths are correlated. Each cell has a Wilson
score interval (binomial in trials[d]; anchors of one prompt are not independent, so read
the interval as a lower bound on the uncertainty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from bole_cli.stats import wilson


@dataclass
class RankTally:
    """Running counts over prompts (rank 0 = the draft's top-1; -1 = a miss)."""

    depth: int
    topk: int
    anchors: int = 0
    prompts: int = 0
    generated: int = 0
    mismatches: int = 0
    trials: list = field(default_factory=list)
    counts: list = field(default_factory=list)
    chain_trials: list = field(default_factory=list)
    chain_hits: list = field(default_factory=list)
    chain_accepted: int = 0  # sum over anchors of the greedy chain's accepted drafts

    def __post_init__(self) -> None:
        self.trials = self.trials or [0] * self.depth
        self.counts = self.counts or [[0] * self.topk for _ in range(self.depth)]
        self.chain_trials = self.chain_trials or [0] * self.depth
        self.chain_hits = self.chain_hits or [0] * self.depth

    def add(self, ranks: Sequence[Sequence[int]], generated: int = 0, mismatches: int = 0) -> None:
        self.prompts += 1
        self.generated += generated
        self.mismatches += mismatches
        for row in ranks:
            self.anchors += 1
            tree_alive = chain_alive = True
            run = 0
            for d, r in enumerate(row[: self.depth]):
                if tree_alive:
                    self.trials[d] += 1
                    if 0 <= r < self.topk:
                        self.counts[d][r] += 1
                    else:
                        tree_alive = False
                if chain_alive:
                    self.chain_trials[d] += 1
                    if r == 0:
                        self.chain_hits[d] += 1
                        run += 1
                    else:
                        chain_alive = False
            self.chain_accepted += run

    def matrix(self) -> list[list[float]]:
        return [[c / t if t else 0.0 for c in row] for row, t in zip(self.counts, self.trials)]

    def intervals(self) -> tuple[list[list[float]], list[list[float]]]:
        lo, hi = [], []
        for row, t in zip(self.counts, self.trials):
            cells = [wilson(c, t) for c in row]
            lo.append([a for a, _ in cells])
            hi.append([b for _, b in cells])
        return lo, hi

    def chain_committed(self) -> float:
        """Measured mean committed tokens per step of a greedy chain of `depth` drafts
        (bonus token included), over all anchors."""
        return 1.0 + self.chain_accepted / self.anchors if self.anchors else 1.0
