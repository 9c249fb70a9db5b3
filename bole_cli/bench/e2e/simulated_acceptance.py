"""The simulated acceptance of `bole bench e2e`: which drafted nodes the target accepts.

Acceptance is SIMULATED (costs are measured). Below a node at depth d, the drafter's rank-r
candidate is the target's token with probability q[d][r] (the events exclude each other);
the draft probability of that node IS q[d][r] (a calibrated drafter), so a node is accepted
with probability equal to its path's draft probability (docs/design.md §2, §8). q is
the calibrate preset's (bole_cli/calibrate/acceptance.py: top-1 acceptance
a * DEPTH_DECAY^(d-1), rank factor 0.5, a fitted so that the beam tree this drafter grows,
bole_cli/bench/drafter.py, at budget 128, depth 8 and top-k 4 commits the paper's mean
accepted tokens: paper-mbpp 6.70 per step, bonus token included), the same q `bole
calibrate` and `bole serve` read. One
`random.Random` per (seed, request, step) draws the walk, so the tree decoders accept
exactly the same nodes. `greedy` instead accepts a draft token iff it equals the target's
argmax at its parent (real tokens): the exactness check, under which every decoder emits
the same token stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from bole_cli.bench.drafter import DraftLayout
from bole_cli.calibrate import acceptance as acc_mod
from bole_cli.errors import InputError

GREEDY = "greedy"


@dataclass(frozen=True)
class Acceptance:
    """Per-depth, per-rank probabilities q[d][r] (draft probability = acceptance
    probability), or greedy acceptance (q then only shapes the tree and the budget).
    Presets keep their depth-1 top-1 acceptance and regenerate q for any depth / top-k."""

    name: str
    source: str
    q: tuple[tuple[float, ...], ...]  # as given (files), or at the paper's depth and top-k
    greedy: bool = False
    top1_depth1: Optional[float] = None

    def rows(self, depth: int, topk: int) -> list[list[float]]:
        """q for `depth` levels of `topk` ranks (ranks a file lacks get 1e-12)."""
        if self.top1_depth1 is not None:
            return acc_mod.preset_rows(self.top1_depth1, depth, topk)
        if len(self.q) < depth:
            raise InputError(f"--acceptance {self.name}: gives {len(self.q)} depths; --depth {depth} needs {depth}")
        return [list(r[:topk]) + [1e-12] * max(0, topk - len(r)) for r in self.q[:depth]]

    def describe(self, depth: int, topk: int) -> dict[str, Any]:
        return {"name": self.name, "mode": "greedy" if self.greedy else "simulated",
                "source": self.source, "top1_depth1": self.top1_depth1,
                "per_depth_rank": [[round(x, 5) for x in r] for r in self.rows(depth, topk)]}

    def statement(self) -> str:
        if self.greedy:
            return ("acceptance: greedy (a draft token is accepted iff it equals the target's argmax; "
                    "random weights, so few are); costs: measured")
        return f"acceptance: simulated ({self.name}: {self.source}); costs: measured"


def paper_shape_expected(acc: Acceptance) -> Optional[float]:
    """Expected committed tokens per step at the paper's shape (depth 8, top-k 4, budget
    128, batch 1) under this acceptance model (None if it has fewer depths)."""
    try:
        rows = acc.rows(acc_mod.PAPER_DEPTH, acc_mod.DEFAULT_TOP_K)
    except InputError:
        return None
    return acc_mod.AcceptanceModel(acc.name, acc.source, q=rows).tree(acc_mod.PAPER_BUDGET)


def load_e2e_acceptance(spec: str) -> Acceptance:
    """A calibrate preset, a per-depth acceptance file, or 'greedy'."""
    if spec == GREEDY:
        base = load_e2e_acceptance(acc_mod.DEFAULT_PRESET)
        return Acceptance(GREEDY, f"tree shape and budget from {base.name}", base.q, True, base.top1_depth1)
    name = acc_mod.canonical_preset(spec)
    if name is not None:  # the preset calibrate and serve read, unchanged
        model = acc_mod.preset(name)
        return Acceptance(name, model.source, tuple(tuple(r) for r in model.q), False,
                          acc_mod.preset_top1(name))
    model = acc_mod.load_acceptance(spec)  # InputError for an unknown name or a bad file
    if model.q is None:
        raise InputError(f"--acceptance {spec}: bole bench e2e needs per-depth acceptance "
                         "(per_depth or per_depth_rank), not a measured curve")
    for d, r in enumerate(model.q):
        if not r:
            raise InputError(f"--acceptance {spec}: depth {d + 1} has no probabilities")
    # a measured 0 (a rank `bole acceptance` never saw hit) counts like a rank a file lacks
    return Acceptance(model.name, model.source,
                      tuple(tuple(p if p > 0 else 1e-12 for p in r) for r in model.q), False)


# ---- one step's accepted path -----------------------------------------------------------------

def step_rng(seed: int, request: int, step: int) -> random.Random:
    """The draws of one (request, step): the same for every decoder of a run."""
    return random.Random(f"bole-e2e/{seed}/{request}/{step}")


def walk_simulated(layout: DraftLayout, q: Sequence[Sequence[float]], kept: dict[int, int],
                   rng: random.Random) -> list[int]:
    """Layout ids of the accepted draft nodes (root excluded): below each accepted node one
    uniform draw picks the rank that is the target's token (or none)."""
    node, path = 0, []
    while True:
        d = layout.node_depth[node]
        if d >= len(q):
            return path
        u, acc, rank = rng.random(), 0.0, None
        for r, p in enumerate(q[d][: layout.topk]):
            acc += p
            if u < acc:
                rank = r
                break
        kids = layout.children[node]
        if rank is None or rank >= len(kids) or kids[rank] not in kept:
            return path
        node = kids[rank]
        path.append(node)


def walk_greedy(layout: DraftLayout, kept: dict[int, int], start: int, target: Sequence[int],
                tokens: Sequence[int]) -> list[int]:
    """Layout ids accepted greedily: follow the (first, by rank) kept child whose token is
    the target's argmax at its parent. target/tokens are packed rows; start = cu[b]."""
    node, path = 0, []
    while True:
        want = target[start + kept[node]]
        nxt = next((c for c in layout.children[node] if c in kept and tokens[start + kept[c]] == want), None)
        if nxt is None:
            return path
        node = nxt
        path.append(node)
