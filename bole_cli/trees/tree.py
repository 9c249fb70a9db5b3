"""One proposal tree (docs/design.md §4): validation, depth and ancestry queries, path scores.

A tree is one request's draft: ``parents`` in topological order (``parents[i] < i``,
-1 = child of the committed prefix, several roots allowed) and ``log_probs``, the draft
log-probability of each node given its parent (<= 0).

Conventions:
- depth counts nodes on the root path, so a root has depth 1 and a chain of n nodes
  has depth n; the largest number of strict ancestors (the ``d`` of Lemma 3, §2) is depth - 1.
- rho(v), the path score, is the product of draft probabilities from the root to v;
  it is kept in log space (``log_rho``) so long paths never underflow.

Pure Python: torch is imported only inside ``ancestor_mask_tensor``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

from bole_cli.errors import InputError, brief
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.trees.values import as_list, check_log_prob, is_int, prob_to_log

#: A node's token: an id, or its text.
Token = Union[int, str]


@dataclass(frozen=True, eq=False)
class ProposalTree:
    """One request's draft tree; validated on construction and immutable afterwards.

    Derived data (depths, children, path scores) is computed once, because the budget
    selector and the CLI query it many times.
    """

    parents: tuple[int, ...]
    log_probs: tuple[float, ...]
    tokens: Optional[tuple[Token, ...]] = None
    _depths: tuple[int, ...] = field(init=False, repr=False)
    _log_rho: tuple[float, ...] = field(init=False, repr=False)
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parents = as_list(self.parents, "parents")
        log_probs = as_list(self.log_probs, "log_probs")
        n = len(parents)
        if n == 0:
            raise InputError("tree is empty: 'parents' has no nodes")
        if n > MAX_TREE_NODES:
            raise InputError(f"tree has {n} nodes; at most {MAX_TREE_NODES} (the kernels' limit)")
        if len(log_probs) != n:
            raise InputError(f"'log_probs' has {len(log_probs)} entries but 'parents' has {n}")
        for i, p in enumerate(parents):
            if not is_int(p):
                raise InputError(f"node {i}: parent {brief(p)} is not an integer")
            if p < -1 or p >= n:
                raise InputError(f"node {i}: parent {brief(p)} is out of range (-1 to {n - 1})")
        _check_no_cycle(parents)
        for i, p in enumerate(parents):
            if p >= i:
                raise InputError(f"node {i}: parent {p} is not before it")
        log_probs = [check_log_prob(i, lp) for i, lp in enumerate(log_probs)]
        tokens = None
        if self.tokens is not None:
            tokens = as_list(self.tokens, "tokens")
            if len(tokens) != n:
                raise InputError(f"'tokens' has {len(tokens)} entries but 'parents' has {n}")
            for i, t in enumerate(tokens):
                if not (is_int(t) or isinstance(t, str)):
                    raise InputError(f"node {i}: token {brief(t)} must be an id (integer) or a string")
            tokens = tuple(tokens)

        depths = [0] * n
        log_rho = [0.0] * n
        children: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(parents):
            if p < 0:
                depths[i], log_rho[i] = 1, log_probs[i]
            else:
                depths[i], log_rho[i] = depths[p] + 1, log_rho[p] + log_probs[i]
                children[p].append(i)
        set_ = object.__setattr__
        set_(self, "parents", tuple(parents))
        set_(self, "log_probs", tuple(log_probs))
        set_(self, "tokens", tokens)
        set_(self, "_depths", tuple(depths))
        set_(self, "_log_rho", tuple(log_rho))
        set_(self, "_children", tuple(tuple(c) for c in children))

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_probs(cls, parents: Sequence[int], probs: Sequence[float],
                   tokens: Optional[Sequence[Token]] = None) -> "ProposalTree":
        """Build from probabilities in (0, 1] instead of log-probabilities."""
        probs = as_list(probs, "probs")
        return cls(parents, [prob_to_log(i, p) for i, p in enumerate(probs)], tokens)

    # -- basics -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.parents)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProposalTree):
            return NotImplemented
        return (self.parents, self.log_probs, self.tokens) == (
            other.parents, other.log_probs, other.tokens)

    def __hash__(self) -> int:
        return hash((self.parents, self.log_probs, self.tokens))

    @property
    def n_nodes(self) -> int:
        return len(self.parents)

    @property
    def roots(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.parents) if p < 0)

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Children of each node, ascending."""
        return self._children

    @property
    def probs(self) -> tuple[float, ...]:
        return tuple(math.exp(lp) for lp in self.log_probs)

    # -- depth and ancestry -------------------------------------------------------------
    @property
    def depths(self) -> tuple[int, ...]:
        """Nodes on each node's root path, itself included (a root has depth 1)."""
        return self._depths

    @property
    def depth(self) -> int:
        """The longest root path, in nodes (a chain of n nodes has depth n)."""
        return max(self._depths)

    @property
    def draft_depth(self) -> int:
        """Draft levels below the root, the verified token (level 0): what --depth means
        in `bole inspect-tree`, `bole bench e2e` and SGLang's --speculative-num-steps (a
        beam tree of depth 8 has nodes on 9 levels)."""
        return self.depth - 1

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per level: widths[d - 1] is the number of nodes of depth d."""
        w = [0] * self.depth
        for d in self._depths:
            w[d - 1] += 1
        return tuple(w)

    def ancestors(self, i: int) -> tuple[int, ...]:
        """Strict ancestors of node i, root first (the order the kernels walk them)."""
        self._check_index(i)
        out = []
        p = self.parents[i]
        while p >= 0:
            out.append(p)
            p = self.parents[p]
        return tuple(reversed(out))

    def path(self, i: int) -> tuple[int, ...]:
        """Root-to-i path, i included."""
        return self.ancestors(i) + (i,)

    def ancestor_mask(self, include_self: bool = True) -> list[list[bool]]:
        """mask[i][j] is True when j is an ancestor of i (or i itself): the tree
        attention mask, and the support of C in Theorem 1."""
        n = self.n_nodes
        rows: list[list[bool]] = []
        for i, p in enumerate(self.parents):
            row = list(rows[p]) if p >= 0 else [False] * n
            if p >= 0:
                row[p] = True
            rows.append(row)
        if include_self:
            for i in range(n):
                rows[i][i] = True
        return rows

    def ancestor_mask_tensor(self, device: Any = "cpu", include_self: bool = True):
        """The ancestor mask as a torch.bool [n, n] tensor."""
        import torch

        return torch.tensor(self.ancestor_mask(include_self), dtype=torch.bool, device=device)

    # -- scores ---------------------------------------------------------------------------
    @property
    def log_rho(self) -> tuple[float, ...]:
        """log rho(v): the sum of draft log-probs along v's root path."""
        return self._log_rho

    @property
    def rho(self) -> tuple[float, ...]:
        return tuple(math.exp(x) for x in self._log_rho)

    def expected_accepted(self, nodes: Optional[Iterable[int]] = None) -> float:
        """Sum of rho over the nodes (all by default): the expected number of tokens a
        verify of those nodes accepts when rho is the acceptance probability."""
        idx = range(self.n_nodes) if nodes is None else nodes
        return math.fsum(math.exp(self._log_rho[i]) for i in idx)

    def best_path(self) -> tuple[int, ...]:
        """The greedy top-1 path: the best-scoring root, then the best child each step
        (ties to the lower index). Budget selection keeps its start as a minimum."""
        key = lambda i: (-self._log_rho[i], i)  # noqa: E731
        node = min(self.roots, key=key)
        out = [node]
        while self._children[node]:
            node = min(self._children[node], key=key)
            out.append(node)
        return tuple(out)

    # -- sub-trees ------------------------------------------------------------------------
    def induced(self, nodes: Iterable[int]) -> tuple["ProposalTree", tuple[int, ...]]:
        """The sub-tree on `nodes` (which must contain every kept node's parent), renumbered
        in original order, and the original id of each new node."""
        ids = sorted(set(nodes))
        if not ids:
            raise InputError("tree is empty: no nodes selected")
        new = {old: k for k, old in enumerate(ids)}
        parents = []
        for old in ids:
            self._check_index(old)
            p = self.parents[old]
            if p >= 0 and p not in new:
                raise InputError(f"node {old}: parent {p} is not selected")
            parents.append(new[p] if p >= 0 else -1)
        tokens = None if self.tokens is None else [self.tokens[i] for i in ids]
        return ProposalTree(parents, [self.log_probs[i] for i in ids], tokens), tuple(ids)

    def to_dict(self, use_probs: bool = False) -> dict[str, Any]:
        """The file format: parents, log_probs (or probs), tokens when present."""
        d: dict[str, Any] = {"parents": list(self.parents)}
        if use_probs:
            d["probs"] = list(self.probs)
        else:
            d["log_probs"] = list(self.log_probs)
        if self.tokens is not None:
            d["tokens"] = list(self.tokens)
        return d

    def _check_index(self, i: int) -> None:
        if not is_int(i) or not 0 <= i < self.n_nodes:
            raise IndexError(f"node {i!r} is not in a tree of {self.n_nodes} nodes")


def _check_no_cycle(parents: list[int]) -> None:
    """Reject cycles with the loop spelt out; O(n) colouring walk."""
    state = [0] * len(parents)  # 0 unseen, 1 on the current walk, 2 reaches a root
    for start in range(len(parents)):
        walk = []
        node = start
        while node >= 0 and state[node] == 0:
            state[node] = 1
            walk.append(node)
            node = parents[node]
        if node >= 0 and state[node] == 1:  # came back onto this walk: a cycle
            loop = walk[walk.index(node):]
            first = min(loop)
            k = loop.index(first)
            loop = loop[k:] + loop[:k]
            # a walk follows parents, so spell it child -> parent -> ... -> child
            text = " -> ".join(str(x) for x in loop + [first])
            raise InputError(f"node {first}: parents form a cycle ({text})")
        for x in walk:
            state[x] = 2
