"""Tree generators (docs/design.md §4): chains, EAGLE-style beam trees, random trees.

They draw from :class:`random.Random` (standard library, so kernel tests need nothing
else) and accept a ``Random`` or an int seed.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Optional, Sequence, Union

from bole_cli.errors import InputError
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.trees.forest import Forest, pack_forest
from bole_cli.trees.tree import ProposalTree
from bole_cli.trees.values import as_list, is_int, is_number, prob_to_log

RngLike = Union[random.Random, int, None]


def _rng(rng: RngLike) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def chain_tree(n: int, prob: float = 0.9) -> ProposalTree:
    """A single path of n nodes (depth n), every draft probability `prob`: the deepest
    tree for its size, the worst case for serial verification."""
    if not is_int(n) or n < 1:
        raise InputError(f"chain length must be a positive integer, got {n!r}")
    lp = prob_to_log(0, prob)
    return ProposalTree([i - 1 for i in range(n)], [lp] * n)


def beam_tree_size(depth: int, topk: int) -> int:
    """Nodes in beam_tree(depth, topk): the root, topk first-level drafts, then topk**2
    candidates for each further level."""
    return 1 + topk + (depth - 1) * topk * topk


def check_beam_tree_size(depth: int, topk: int, what: str) -> int:
    """beam_tree_size(depth, topk), or InputError naming `what` (the options that asked for
    it) when the tree kernels cannot take that many nodes a request."""
    size = beam_tree_size(depth, topk)
    if size > MAX_TREE_NODES:
        raise InputError(f"{what} drafts {size} nodes per request; the tree kernels take at most "
                         f"{MAX_TREE_NODES}")
    return size


def _check_level_probs(level_probs: Any, depth: int, topk: int) -> list[list[float]]:
    rows = as_list(level_probs, "level_probs")
    if rows and not isinstance(rows[0], (list, tuple)) and not hasattr(rows[0], "tolist"):
        rows = [rows] * depth
    if len(rows) != depth:
        raise InputError(f"level_probs has {len(rows)} levels; expected {depth} (depth) "
                         f"or one list of {topk} probabilities for every level")
    out = []
    for lvl, row in enumerate(rows):
        row = as_list(row, f"level_probs[{lvl}]")
        if len(row) != topk:
            raise InputError(f"level_probs[{lvl}] has {len(row)} probabilities; expected "
                             f"{topk} (topk)")
        for p in row:
            if not is_number(p) or math.isnan(p) or not 0.0 < p <= 1.0:
                raise InputError(f"level_probs[{lvl}]: probability {p!r} is outside (0, 1]")
        if sum(row) > 1.0 + 1e-9:
            raise InputError(f"level_probs[{lvl}]: probabilities sum to {sum(row):g} > 1")
        out.append([float(p) for p in row])
    return out


def _draft_probs(rng: random.Random, topk: int) -> list[float]:
    """One node's top-k draft probabilities: a Dirichlet draw over k + 1 outcomes (the k
    drafted tokens, alpha 0.2 each, and "anything else", alpha 0.05), sorted. That is
    spiky like a real drafter: depth 8, top-k 4 averages about 5.7 expected accepted
    tokens over the whole tree, close to the paper's 5-7 at budget 128."""
    g = [rng.gammavariate(0.2, 1.0) for _ in range(topk)] + [rng.gammavariate(0.05, 1.0)]
    total = sum(g) or 1.0
    return sorted((max(x / total, 1e-12) for x in g[:topk]), reverse=True)


def grow_beam(depth: int, topk: int, draft_log_probs: Callable[[int], Sequence[float]]
              ) -> tuple[list[int], list[float], list[float]]:
    """Every candidate of the beam tree (see beam_tree), with no node limit: parents,
    draft log-probs and path scores log rho, node 0 the root.

    draft_log_probs(level) gives the topk child log-probs of one expanded node at that
    level (0-based), called once per expanded node in order. The acceptance fit grows
    SGLang's trees here, which may exceed MAX_TREE_NODES.
    """
    parents, log_probs, score = [-1], [0.0], [0.0]
    frontier = [0]
    for lvl in range(depth):
        new = []
        for node in frontier:
            for lp in draft_log_probs(lvl):
                parents.append(node)
                log_probs.append(lp)
                score.append(score[node] + lp)
                new.append(len(parents) - 1)
        frontier = sorted(new, key=lambda i: (-score[i], i))[:topk]
    return parents, log_probs, score


def beam_tree(depth: int, topk: int, seed: RngLike = 0,
              level_probs: Any = None) -> ProposalTree:
    """An EAGLE-style draft tree, as SGLang's EAGLE worker grows it before pruning.

    Node 0 is the last verified token (the single root, log-prob 0). Level 1 holds the
    root's top-k drafts. At each further level, the top-k nodes of the previous level by
    path score rho (ties to the lower index) are expanded by their top-k drafts, so a
    level adds topk**2 candidates; only those k "beam" nodes get children. The result
    (``beam_tree_size(depth, topk)`` nodes, ``depth + 1`` levels) is every candidate the
    drafter scored; a budget then keeps the best N (SGLang keeps num_draft_tokens - 1).

    Draft probabilities come from `level_probs` (topk values per level, or one list for
    every level; the i-th child gets the i-th value) or, when None, from a seeded
    Dirichlet draw per expanded node (see _draft_probs).
    """
    if not is_int(depth) or depth < 1:
        raise InputError(f"depth must be a positive integer, got {depth!r}")
    if not is_int(topk) or topk < 1:
        raise InputError(f"topk must be a positive integer, got {topk!r}")
    size = beam_tree_size(depth, topk)
    if size > MAX_TREE_NODES:
        raise InputError(f"depth {depth} with topk {topk} gives {size} nodes; at most "
                         f"{MAX_TREE_NODES} (the kernels' limit)")
    if level_probs is not None:
        logs = [[math.log(p) for p in row] for row in _check_level_probs(level_probs, depth, topk)]
        draft = logs.__getitem__
    else:
        rng = _rng(seed)
        draft = lambda lvl: [math.log(p) for p in _draft_probs(rng, topk)]  # noqa: E731
    parents, log_probs, _ = grow_beam(depth, topk, draft)
    return ProposalTree(parents, log_probs)


#: Shapes random_tree can draw; "any" picks one of the others at random.
TREE_SHAPES = ("random", "chain", "wide", "roots", "any")


def _random_log_prob(rng: random.Random) -> float:
    # one in ten exactly 0 (probability 1) so that ties on rho are common
    return 0.0 if rng.random() < 0.1 else math.log(rng.uniform(1e-3, 1.0))


def random_tree(rng: RngLike, n_nodes: int, max_depth: Optional[int] = None,
                n_roots: Optional[int] = 1, *, shape: str = "random") -> ProposalTree:
    """A random valid tree of n_nodes, for kernel and property tests.

    shape "random": node 0 and n_roots - 1 other random nodes are roots; every other
    node picks its parent among earlier nodes of depth < max_depth, sticking to the
    previous node with a per-tree probability so both bushy and deep trees appear.
    "chain" (depth = n_nodes), "wide" (one root, all others its children) and "roots"
    (every node a root) are the extreme cases (n_roots applies to "random" only); "any"
    picks one of the four that fits max_depth, with a random root count when n_roots is
    None. Log-probs are log U(0.001, 1], one in ten
    exactly 0 (ties on rho).
    """
    r = _rng(rng)
    if not is_int(n_nodes) or not 1 <= n_nodes <= MAX_TREE_NODES:
        raise InputError(f"n_nodes must be 1 to {MAX_TREE_NODES}, got {n_nodes!r}")
    if shape not in TREE_SHAPES:
        raise InputError(f"shape {shape!r}: expected one of {', '.join(TREE_SHAPES)}")
    if max_depth is not None and (not is_int(max_depth) or max_depth < 1):
        raise InputError(f"max_depth must be a positive integer, got {max_depth!r}")
    n = n_nodes
    limit = n if max_depth is None else max_depth
    fits = {"random": limit >= 2 or n == 1, "chain": n <= limit, "wide": n == 1 or limit >= 2,
            "roots": True}
    if shape == "any":
        shape = r.choice([s for s in ("random", "chain", "wide", "roots") if fits[s]])
        if n_roots is None:
            n_roots = r.randint(1, min(3, n)) if limit >= 2 else n
    elif not fits[shape]:
        raise InputError(f"shape {shape!r} with {n} nodes does not fit max_depth {max_depth}")
    if n_roots is None:
        n_roots = 1
    if shape == "chain":
        parents = [i - 1 for i in range(n)]
    elif shape == "wide":
        parents = [-1] + [0] * (n - 1)
    elif shape == "roots":
        parents = [-1] * n
    else:
        if not is_int(n_roots) or not 1 <= n_roots <= n:
            raise InputError(f"n_roots must be 1 to {n}, got {n_roots!r}")
        if max_depth == 1 and n_roots != n:
            raise InputError(f"max_depth 1 needs every node to be a root (n_roots={n})")
        roots = {0} | set(r.sample(range(1, n), n_roots - 1))
        stick = r.random()
        parents, depth, eligible = [], [], []  # eligible: nodes that may take a child
        for i in range(n):
            if i in roots:
                p = -1
            elif r.random() < stick and (max_depth is None or depth[i - 1] < max_depth):
                p = i - 1
            else:
                p = r.choice(eligible)
            parents.append(p)
            depth.append(1 if p < 0 else depth[p] + 1)
            if max_depth is None or depth[i] < max_depth:
                eligible.append(i)
    return ProposalTree(parents, [_random_log_prob(r) for _ in range(n)])


def random_forest(rng: RngLike, sizes: Sequence[int], max_depth: Optional[int] = None,
                  n_roots: Optional[int] = None, *, shape: str = "any") -> Forest:
    """A packed batch of random trees, one per entry of `sizes` (see random_tree; by
    default each request draws its own shape, so a batch mixes chains, wide trees and
    several roots). The trees themselves are ``forest.tree(b)``."""
    r = _rng(rng)
    sizes = list(sizes)
    if not sizes:
        raise InputError("sizes is empty: a forest needs at least one request")
    return pack_forest([random_tree(r, s, max_depth, n_roots, shape=shape) for s in sizes])
