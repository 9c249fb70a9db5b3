"""Batch-wide budget selection: keep the N best-scoring draft nodes of the whole batch.

Score rho(v) is the product of draft probabilities along v's root path (log space here).
Draft log-probs are <= 0, so a child never outscores its parent; sorting by
(-log rho, request, node) therefore puts every parent before its children, and any
prefix of that order is prefix-connected per request. The selector relies on this and
checks it afterwards instead of repairing anything (docs/design.md §4).

Options:
- ``min_per_request`` m: each request keeps at least the first m nodes of its greedy
  top-1 path (ProposalTree.best_path), so every request verifies something; a budget
  that cannot cover those minimums is an input error.
- ``max_per_request`` c: no request keeps more than c nodes (nodes of a capped request
  are skipped and the budget goes to the next best nodes of other requests; once a
  request is capped it stays capped, so connectivity still holds).

Cost: one pass over the candidates plus one sort of their scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from bole_cli.errors import InputError
from bole_cli.trees.forest import Forest, check_batch, pack_segments
from bole_cli.trees.tree import ProposalTree

__all__ = ["BudgetSelection", "best_first", "select_budget", "expected_accepted_curve"]


@dataclass(frozen=True)
class BudgetSelection:
    """What a budget keeps: the packed forest for tree_verify and the map back.

    ``kept_ids[b][j]`` is the original node id of request b's new local node j (ids
    ascending, so local parents stay before children). ``forest`` holds the kept trees
    with renumbered local parents; a request that keeps nothing owns an empty segment.
    """

    budget: int
    min_per_request: int
    max_per_request: Optional[int]
    forest: Forest
    kept_ids: tuple[tuple[int, ...], ...]
    expected_accepted: tuple[float, ...]  # per request, sum of rho over kept nodes
    expected_accepted_full: tuple[float, ...]  # per request, sum of rho over all nodes
    candidates: int  # nodes offered, over the whole batch

    @property
    def n_kept(self) -> int:
        return self.forest.n_nodes

    @property
    def original_ids(self) -> tuple[int, ...]:
        """Original node id of every packed node, aligned with forest.parents."""
        return tuple(i for ids in self.kept_ids for i in ids)

    def kept_mask(self, b: int, n_nodes: int) -> list[bool]:
        """Which of request b's original nodes are kept."""
        mask = [False] * n_nodes
        for i in self.kept_ids[b]:
            mask[i] = True
        return mask

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "min_per_request": self.min_per_request,
            "max_per_request": self.max_per_request,
            "candidates": self.candidates,
            "kept_nodes": self.n_kept,
            "parents": list(self.forest.parents),
            "cu_seqlens": list(self.forest.cu_seqlens),
            "kept_ids": [list(ids) for ids in self.kept_ids],
            "expected_accepted": list(self.expected_accepted),
            "expected_accepted_full": list(self.expected_accepted_full),
        }


def _check_count(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def best_first(log_rho: Sequence[float]) -> list[int]:
    """Indices from the highest path score down, ties to the lower index: the order in which
    a budget takes nodes (parents before children, as log-probs are <= 0)."""
    return sorted(range(len(log_rho)), key=log_rho.__getitem__, reverse=True)


def select_budget(trees: Sequence[ProposalTree], budget: int, *, min_per_request: int = 1,
                  max_per_request: Optional[int] = None) -> BudgetSelection:
    """Keep the `budget` highest-rho nodes across all requests (ties: request, then node).

    Returns the kept forest (local parents, cu_seqlens), the original ids, and the
    expected accepted length of each kept tree, the quantity a budget trades against
    verification time.
    """
    trees = check_batch(trees, "select from")
    budget = _check_count("budget", budget, 1)
    m = _check_count("min_per_request", min_per_request, 0)
    cap = None if max_per_request is None else _check_count("max_per_request", max_per_request, 1)
    if cap is not None and cap < m:
        raise InputError(f"max_per_request ({cap}) is smaller than min_per_request ({m})")
    if m and budget < len(trees):
        raise InputError(f"budget {budget} is smaller than the number of requests "
                         f"({len(trees)}): every request verifies at least one node")

    keep: list[list[int]] = [[] for _ in trees]
    kept: list[set[int]] = [set() for _ in trees]
    for b, t in enumerate(trees):
        for i in t.best_path()[:m]:
            keep[b].append(i)
            kept[b].add(i)
    used = sum(len(k) for k in keep)
    if used > budget:
        raise InputError(f"budget {budget} cannot cover the minimum of {m} node{'s' * (m != 1)} per request "
                         f"for {len(trees)} request{'s' * (len(trees) != 1)} (needs {used})")

    owner: list[int] = []
    node: list[int] = []
    score: list[float] = []
    for b, t in enumerate(trees):
        for i, lr in enumerate(t.log_rho):
            if i not in kept[b]:
                owner.append(b)
                node.append(i)
                score.append(lr)
    # listed by (request, node): a stable sort on the score alone breaks ties by request,
    # then node, and sorts floats, not tuples (a million candidates in well under a second)
    for c in best_first(score):
        if used == budget:
            break
        b, i = owner[c], node[c]
        if cap is not None and len(keep[b]) >= cap:
            continue
        keep[b].append(i)
        kept[b].add(i)
        used += 1

    segments: list[Optional[ProposalTree]] = []
    ids_out: list[tuple[int, ...]] = []
    for b, t in enumerate(trees):
        for i in kept[b]:  # the property this module rests on; a failure is a bug here
            p = t.parents[i]
            if p >= 0 and p not in kept[b]:
                raise AssertionError(f"request {b}: kept node {i} but not its parent {p}")
        if kept[b]:
            sub, ids = t.induced(kept[b])
        else:
            sub, ids = None, ()
        segments.append(sub)
        ids_out.append(ids)

    return BudgetSelection(
        budget=budget,
        min_per_request=m,
        max_per_request=cap,
        forest=pack_segments(segments),
        kept_ids=tuple(ids_out),
        expected_accepted=tuple(t.expected_accepted(kept[b]) for b, t in enumerate(trees)),
        expected_accepted_full=tuple(t.expected_accepted() for t in trees),
        candidates=sum(t.n_nodes for t in trees),
    )


def expected_accepted_curve(trees: Sequence[ProposalTree], budgets: Sequence[int],
                            **options: Any) -> list[float]:
    """Batch total of expected accepted tokens at each budget: what calibration weighs
    against T_ver(N)."""
    return [math.fsum(select_budget(trees, n, **options).expected_accepted) for n in budgets]
