"""The per-depth, per-rank family every acceptance model here builds on (one home for its
constants and its rank rule): the rank-r draft at depth d is the target's token, given
that ranks < r were wrong, with probability a_d * rank_factor^(r-1); the presets' top-1
acceptance is a_d = a * DEPTH_DECAY^(d-1). bole_cli.calibrate.acceptance and the observed
histograms' fit (observed, family_fit, histogram_file) read it (docs/design.md §8).
"""

from __future__ import annotations

from typing import Sequence

DEFAULT_RANK_FACTOR = 0.5
DEFAULT_TOP_K = 4
PAPER_DEPTH = 8
PAPER_BUDGET = 128
DEPTH_DECAY = 0.97


def rank_matrix(per_depth: Sequence[float], top_k: int = DEFAULT_TOP_K,
                rank_factor: float = DEFAULT_RANK_FACTOR) -> list[list[float]]:
    """q[d][r] from per-depth top-1 acceptance a_d by the rank rule above."""
    q = []
    for a in per_depth:
        row, miss = [], 1.0
        for r in range(top_k):
            c = a * rank_factor**r
            row.append(miss * c)
            miss *= 1.0 - c
        q.append(row)
    return q
