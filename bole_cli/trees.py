"""Proposal trees: validation, queries, packing, SGLang conversion, file I/O, generators.

One tree is one request's draft: ``parents`` in topological order (``parents[i] < i``,
-1 = child of the committed prefix, several roots allowed) and ``log_probs``, the draft
log-probability of each node given its parent (<= 0). The packed form of a batch
(:class:`Forest`) is exactly the kernels' tree-array contract (docs/design.md §3):
``parents[N]`` int32 local to each request and ``cu_seqlens[B+1]`` int32.

Conventions used throughout:
- depth counts nodes on the root path, so a root has depth 1 and a chain of n nodes
  has depth n; the largest number of strict ancestors (the ``d`` of Lemma 3) is depth - 1.
- rho(v), the path score, is the product of draft probabilities from the root to v;
  it is kept in log space (``log_rho``) so long paths never underflow.
- The generators draw from :class:`random.Random` (standard library, so kernel tests
  need nothing else); they accept a ``Random`` or an int seed.

Pure Python: torch is imported only inside the ``*_tensor`` / ``to_torch`` helpers.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

from bole_cli.errors import InputError
from bole_cli.limits import MAX_TREE_NODES

__all__ = [
    "MAX_TREE_NODES",
    "ProposalTree",
    "Forest",
    "pack_forest",
    "SGLangTree",
    "to_sglang",
    "from_sglang",
    "retrieve_parent_token",
    "parse_trees",
    "load_trees",
    "load_sglang",
    "dump_trees",
    "chain_tree",
    "beam_tree",
    "beam_tree_size",
    "random_tree",
    "random_forest",
    "TREE_SHAPES",
]


Token = Union[int, str]
RngLike = Union[random.Random, int, None]


# ---- scalar checks ----------------------------------------------------------------------

def _as_list(values: Any, what: str) -> list:
    """Accept lists, tuples, numpy arrays and torch tensors (via .tolist())."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise InputError(f"'{what}' must be a list, got {type(values).__name__}")
    return list(values)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_log_prob(i: int, lp: Any) -> float:
    if not _is_number(lp):
        raise InputError(f"node {i}: log-prob {lp!r} is not a number")
    lp = float(lp)
    if math.isnan(lp):
        raise InputError(f"node {i}: log-prob is NaN")
    if lp > 0.0:
        raise InputError(f"node {i}: log-prob {lp:g} is positive (a probability above 1)")
    if lp == -math.inf:
        raise InputError(f"node {i}: log-prob is -inf (probability 0)")
    return lp


def _prob_to_log(i: int, p: Any) -> float:
    if not _is_number(p):
        raise InputError(f"node {i}: probability {p!r} is not a number")
    p = float(p)
    if math.isnan(p):
        raise InputError(f"node {i}: probability is NaN")
    if not 0.0 < p <= 1.0:
        raise InputError(f"node {i}: probability {p:g} is outside (0, 1]")
    return math.log(p)


# ---- one tree ---------------------------------------------------------------------------

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
        parents = _as_list(self.parents, "parents")
        log_probs = _as_list(self.log_probs, "log_probs")
        n = len(parents)
        if n == 0:
            raise InputError("tree is empty: 'parents' has no nodes")
        if n > MAX_TREE_NODES:
            raise InputError(f"tree has {n} nodes; at most {MAX_TREE_NODES} (MAX_TREE_NODES)")
        if len(log_probs) != n:
            raise InputError(f"'log_probs' has {len(log_probs)} entries but 'parents' has {n}")
        for i, p in enumerate(parents):
            if not _is_int(p):
                raise InputError(f"node {i}: parent {p!r} is not an integer")
            if p < -1 or p >= n:
                raise InputError(f"node {i}: parent {p} is out of range (-1 to {n - 1})")
        _check_no_cycle(parents)
        for i, p in enumerate(parents):
            if p >= i:
                raise InputError(f"node {i}: parent {p} is not before it")
        log_probs = [_check_log_prob(i, lp) for i, lp in enumerate(log_probs)]
        tokens = None
        if self.tokens is not None:
            tokens = _as_list(self.tokens, "tokens")
            if len(tokens) != n:
                raise InputError(f"'tokens' has {len(tokens)} entries but 'parents' has {n}")
            for i, t in enumerate(tokens):
                if not (_is_int(t) or isinstance(t, str)):
                    raise InputError(f"node {i}: token {t!r} must be an id (integer) or a string")
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
        probs = _as_list(probs, "probs")
        return cls(parents, [_prob_to_log(i, p) for i, p in enumerate(probs)], tokens)

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
        if not _is_int(i) or not 0 <= i < self.n_nodes:
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


# ---- a packed batch ---------------------------------------------------------------------

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


def _pack(segments: Sequence[Optional[ProposalTree]]) -> Forest:
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
    return _pack(check_batch(trees, "pack"))


# ---- SGLang's packed form ---------------------------------------------------------------

class SGLangTree(NamedTuple):
    """One request's arrays as SGLang's EAGLE worker builds them (node 0 = the last
    verified token; first child / next sibling, -1 = none)."""

    retrive_next_token: list[int]
    retrive_next_sibling: list[int]


def to_sglang(tree: ProposalTree) -> SGLangTree:
    """SGLang's first-child / next-sibling arrays for a tree rooted at node 0.

    Siblings are linked in ascending index order, which is the order SGLang's
    build_tree_efficient produces, so SGLang arrays survive a round trip unchanged.
    """
    extra = [i for i in tree.roots if i != 0]
    if tree.parents[0] != -1 or extra:
        bad = extra[0] if extra else 0
        raise InputError(f"node {bad}: SGLang trees have a single root, node 0 "
                         "(the last verified token)")
    n = tree.n_nodes
    next_token = [-1] * n
    next_sibling = [-1] * n
    for p, kids in enumerate(tree.children):
        if kids:
            next_token[p] = kids[0]
            for a, b in zip(kids, kids[1:]):
                next_sibling[a] = b
    return SGLangTree(next_token, next_sibling)


def _sglang_parents(retrive_next_token: Any, retrive_next_sibling: Any) -> list[int]:
    nt = _as_list(retrive_next_token, "retrive_next_token")
    ns = _as_list(retrive_next_sibling, "retrive_next_sibling")
    n = len(nt)
    if n == 0:
        raise InputError("tree is empty: 'retrive_next_token' has no nodes")
    if len(ns) != n:
        raise InputError(f"'retrive_next_sibling' has {len(ns)} entries but "
                         f"'retrive_next_token' has {n}")
    if n > MAX_TREE_NODES:
        raise InputError(f"tree has {n} nodes; at most {MAX_TREE_NODES} (MAX_TREE_NODES)")
    for name, arr in (("retrive_next_token", nt), ("retrive_next_sibling", ns)):
        for i, x in enumerate(arr):
            if not _is_int(x):
                raise InputError(f"{name}[{i}]: {x!r} is not an integer")
            if x < -1 or x >= n:
                raise InputError(f"{name}[{i}]: {x} is out of range (-1 to {n - 1})")
    if ns[0] != -1:
        raise InputError("retrive_next_sibling[0]: node 0 (the last verified token) is the "
                         f"single root and cannot have a sibling, got {ns[0]}")
    parents = [-2] * n
    parents[0] = -1
    stack = [0]
    while stack:
        p = stack.pop()
        c = nt[p]
        while c != -1:
            if parents[c] != -2:
                raise InputError(f"node {c}: reached twice through the links "
                                 "(a cycle or a shared child)")
            if c <= p:
                raise InputError(f"node {c}: parent {p} is not before it")
            parents[c] = p
            stack.append(c)
            c = ns[c]
    for i, p in enumerate(parents):
        if p == -2:
            raise InputError(f"node {i}: not reachable from node 0 (dangling)")
    return parents


def retrieve_parent_token(retrive_next_token: Any, retrive_next_sibling: Any) -> list[int]:
    """Parent index of each node (-1 for node 0), the array SGLang's tree-aware GDN
    verify kernel takes, derived from the first-child / next-sibling links."""
    return _sglang_parents(retrive_next_token, retrive_next_sibling)


def from_sglang(retrive_next_token: Any, retrive_next_sibling: Any,
                log_probs: Any = None, *, probs: Any = None,
                tokens: Any = None) -> ProposalTree:
    """A ProposalTree from one request's SGLang arrays.

    Draft scores may cover all n nodes or only the n - 1 draft nodes (node 0, the
    verified token, then gets log-prob 0). With no scores the tree is structure only
    (every log-prob 0).
    """
    parents = _sglang_parents(retrive_next_token, retrive_next_sibling)
    n = len(parents)
    if log_probs is not None and probs is not None:
        raise InputError("give either 'probs' or 'log_probs', not both")
    if probs is not None:
        vals = _as_list(probs, "probs")
        key = "probs"
    elif log_probs is not None:
        vals = _as_list(log_probs, "log_probs")
        key = "log_probs"
    else:
        vals, key = [0.0] * n, "log_probs"
    if len(vals) == n - 1:
        vals = [1.0 if key == "probs" else 0.0] + list(vals)
    elif len(vals) != n:
        raise InputError(f"'{key}' has {len(vals)} entries; expected {n} (every node) "
                         f"or {n - 1} (the draft nodes after node 0)")
    if tokens is not None:
        tokens = _as_list(tokens, "tokens")
    if key == "probs":
        return ProposalTree.from_probs(parents, vals, tokens)
    return ProposalTree(parents, vals, tokens)


# ---- files --------------------------------------------------------------------------------

_TREE_KEYS = ("parents", "probs", "log_probs", "tokens")
_SGLANG_KEYS = ("retrive_next_token", "retrive_next_sibling", "probs", "log_probs",
                "tokens", "draft_token")


def _tree_from_mapping(d: Any) -> ProposalTree:
    if not isinstance(d, dict):
        raise InputError(f"a tree must be a mapping with 'parents', got {type(d).__name__}")
    unknown = [k for k in d if k not in _TREE_KEYS]
    if unknown:
        hint = " (SGLang arrays? use --sglang)" if "retrive_next_token" in d else ""
        raise InputError(f"unknown field '{unknown[0]}'{hint}; expected "
                         + ", ".join(_TREE_KEYS))
    if "parents" not in d:
        raise InputError("missing field 'parents'")
    has_p, has_lp = "probs" in d, "log_probs" in d
    if has_p and has_lp:
        raise InputError("give either 'probs' or 'log_probs', not both")
    if not (has_p or has_lp):
        raise InputError("missing field 'probs' or 'log_probs'")
    parents = _as_list(d["parents"], "parents")
    tokens = d.get("tokens")
    if has_p:
        probs = _as_list(d["probs"], "probs")
        if len(probs) != len(parents):
            raise InputError(f"'probs' has {len(probs)} entries but 'parents' has {len(parents)}")
        return ProposalTree.from_probs(parents, probs, tokens)
    return ProposalTree(parents, d["log_probs"], tokens)


def _prefixed(label: str, fn, *args):
    try:
        return fn(*args)
    except InputError as exc:
        raise InputError(f"{label}: {exc}") from None


def parse_trees(data: Any, source: str = "input") -> list[ProposalTree]:
    """Trees from parsed JSON/YAML: one mapping (one tree) or a list (a batch).
    Errors name the source, the tree (for a batch) and the node or field."""
    if isinstance(data, dict):
        return [_prefixed(source, _tree_from_mapping, data)]
    if isinstance(data, list):
        if not data:
            raise InputError(f"{source}: the list of trees is empty")
        return [_prefixed(f"{source}: tree {b}", _tree_from_mapping, d)
                for b, d in enumerate(data)]
    raise InputError(f"{source}: expected a tree (mapping) or a list of trees, "
                     f"got {type(data).__name__}")


def _read_structured(path: Union[str, os.PathLike]) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({type(exc).__name__})") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "parse error"
        raise InputError(f"{path}: not valid YAML ({first})") from None


def load_trees(path: Union[str, os.PathLike]) -> list[ProposalTree]:
    """Read a tree file (JSON by suffix, YAML otherwise): one tree or a list of trees."""
    return parse_trees(_read_structured(path), str(path))


def _sglang_from_mapping(d: Any) -> list[ProposalTree]:
    if not isinstance(d, dict):
        raise InputError(f"expected a mapping with 'retrive_next_token', got {type(d).__name__}")
    unknown = [k for k in d if k not in _SGLANG_KEYS]
    if unknown:
        raise InputError(f"unknown field '{unknown[0]}'; expected " + ", ".join(_SGLANG_KEYS))
    for k in ("retrive_next_token", "retrive_next_sibling"):
        if k not in d:
            raise InputError(f"missing field '{k}'")
    if "probs" in d and "log_probs" in d:
        raise InputError("give either 'probs' or 'log_probs', not both")
    if "probs" not in d and "log_probs" not in d:
        raise InputError("missing field 'probs' or 'log_probs' (draft probabilities)")
    if "tokens" in d and "draft_token" in d:
        raise InputError("give either 'tokens' or 'draft_token', not both")
    nt = _as_list(d["retrive_next_token"], "retrive_next_token")
    batched = bool(nt) and isinstance(nt[0], (list, tuple))

    def rows(key: str) -> list:
        v = d.get(key)
        if v is None:
            return [None] * len(nt)
        v = _as_list(v, key)
        if len(v) != len(nt):
            raise InputError(f"'{key}' has {len(v)} rows but 'retrive_next_token' has {len(nt)}")
        return v

    tok_key = "draft_token" if "draft_token" in d else "tokens"
    if not batched:
        return [_from_sglang_kw(nt, d["retrive_next_sibling"], d.get("log_probs"),
                                d.get("probs"), d.get(tok_key))]
    ns, lp, pr, tk = (rows("retrive_next_sibling"), rows("log_probs"), rows("probs"),
                      rows(tok_key))
    return [_prefixed(f"request {b}", _from_sglang_kw, nt[b], ns[b], lp[b], pr[b], tk[b])
            for b in range(len(nt))]


def _from_sglang_kw(nt: Any, ns: Any, lp: Any, pr: Any, tk: Any) -> ProposalTree:
    return from_sglang(nt, ns, lp, probs=pr, tokens=tk)


def load_sglang(path: Union[str, os.PathLike]) -> list[ProposalTree]:
    """Read SGLang arrays (retrive_next_token / retrive_next_sibling plus draft probs or
    log-probs, optional tokens or draft_token): one request's 1-D arrays, [bs, n] 2-D
    arrays, or a list of one-request mappings."""
    data = _read_structured(path)
    source = str(path)
    if isinstance(data, list):
        if not data:
            raise InputError(f"{source}: the list of requests is empty")
        out: list[ProposalTree] = []
        for b, d in enumerate(data):
            out.extend(_prefixed(f"{source}: request {b}", _sglang_from_mapping, d))
        return out
    return _prefixed(source, _sglang_from_mapping, data)


def dump_trees(path: Union[str, os.PathLike], trees: Union[ProposalTree, Sequence[ProposalTree]],
               *, use_probs: bool = False) -> Path:
    """Write trees atomically in load_trees' format: JSON for .json, else YAML. A single
    tree is written as a mapping, a sequence as a list. Log-probs (the default) round-trip
    exactly; probs are friendlier to read."""
    from bole_cli.console import atomic_write_text, dumps_json

    data: Any
    if isinstance(trees, ProposalTree):
        data = trees.to_dict(use_probs)
    else:
        data = [t.to_dict(use_probs) for t in trees]
    path = Path(path)
    if path.suffix.lower() == ".json":
        text = dumps_json(data) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    return atomic_write_text(path, text)


# ---- generators -----------------------------------------------------------------------------

def _rng(rng: RngLike) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def chain_tree(n: int, prob: float = 0.9) -> ProposalTree:
    """A single path of n nodes (depth n), every draft probability `prob`: the deepest
    tree for its size, the worst case for serial verification."""
    if not _is_int(n) or n < 1:
        raise InputError(f"chain length must be a positive integer, got {n!r}")
    lp = _prob_to_log(0, prob)
    return ProposalTree([i - 1 for i in range(n)], [lp] * n)


def beam_tree_size(depth: int, topk: int) -> int:
    """Nodes in beam_tree(depth, topk): the root, topk first-level drafts, then topk**2
    candidates for each further level."""
    return 1 + topk + (depth - 1) * topk * topk


def _check_level_probs(level_probs: Any, depth: int, topk: int) -> list[list[float]]:
    rows = _as_list(level_probs, "level_probs")
    if rows and not isinstance(rows[0], (list, tuple)) and not hasattr(rows[0], "tolist"):
        rows = [rows] * depth
    if len(rows) != depth:
        raise InputError(f"level_probs has {len(rows)} levels; expected {depth} (depth) "
                         f"or one list of {topk} probabilities for every level")
    out = []
    for lvl, row in enumerate(rows):
        row = _as_list(row, f"level_probs[{lvl}]")
        if len(row) != topk:
            raise InputError(f"level_probs[{lvl}] has {len(row)} probabilities; expected "
                             f"{topk} (topk)")
        for p in row:
            if not _is_number(p) or math.isnan(p) or not 0.0 < p <= 1.0:
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
    if not _is_int(depth) or depth < 1:
        raise InputError(f"depth must be a positive integer, got {depth!r}")
    if not _is_int(topk) or topk < 1:
        raise InputError(f"topk must be a positive integer, got {topk!r}")
    size = beam_tree_size(depth, topk)
    if size > MAX_TREE_NODES:
        raise InputError(f"depth {depth} with topk {topk} gives {size} nodes; at most "
                         f"{MAX_TREE_NODES} (MAX_TREE_NODES)")
    levels = None if level_probs is None else _check_level_probs(level_probs, depth, topk)
    rng = _rng(seed)
    parents, log_probs, score = [-1], [0.0], [0.0]
    frontier = [0]
    for lvl in range(depth):
        new = []
        for node in frontier:
            probs = levels[lvl] if levels is not None else _draft_probs(rng, topk)
            for p in probs:
                parents.append(node)
                log_probs.append(math.log(p))
                score.append(score[node] + math.log(p))
                new.append(len(parents) - 1)
        frontier = sorted(new, key=lambda i: (-score[i], i))[:topk]
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
    if not _is_int(n_nodes) or not 1 <= n_nodes <= MAX_TREE_NODES:
        raise InputError(f"n_nodes must be 1 to {MAX_TREE_NODES}, got {n_nodes!r}")
    if shape not in TREE_SHAPES:
        raise InputError(f"shape {shape!r}: expected one of {', '.join(TREE_SHAPES)}")
    if max_depth is not None and (not _is_int(max_depth) or max_depth < 1):
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
        if not _is_int(n_roots) or not 1 <= n_roots <= n:
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
