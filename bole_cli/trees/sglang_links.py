"""SGLang's tree links <-> Bole's parents: the one conversion each way (docs/design.md §6).

SGLang's EAGLE worker describes one request's draft tree by first-child / next-sibling
links (``retrive_next_token`` / ``retrive_next_sibling``, SGLang's spelling, -1 = none)
with node 0 the last verified token, the single root. Bole's form is the -1-rooted local
``parents`` of :class:`ProposalTree`. SGLang's own per-node parent table (the
``retrieve_parent_token`` its tree conv kernel fills) equals those parents except at
node 0, where SGLang writes 0 ("n/a") and Bole writes -1 (the root); tensor callers
convert at that edge and through ``.tolist()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from bole_cli.errors import InputError, brief
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.trees.tree import ProposalTree
from bole_cli.trees.values import as_list, is_int


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


def retrieve_parent_token(retrive_next_token: Any, retrive_next_sibling: Any) -> list[int]:
    """Bole's parents of one request's SGLang tree (-1 for node 0), checked: every node
    reached once from node 0, each after its parent.

    SGLang's tree conv kernel fills its retrieve_parent_token table with the same parents
    but 0 at node 0; every other entry agrees (see the module docstring).
    """
    nt = as_list(retrive_next_token, "retrive_next_token")
    ns = as_list(retrive_next_sibling, "retrive_next_sibling")
    n = len(nt)
    if n == 0:
        raise InputError("tree is empty: 'retrive_next_token' has no nodes")
    if len(ns) != n:
        raise InputError(f"'retrive_next_sibling' has {len(ns)} entries but "
                         f"'retrive_next_token' has {n}")
    if n > MAX_TREE_NODES:
        raise InputError(f"tree has {n} nodes; at most {MAX_TREE_NODES} (the kernels' limit)")
    for name, arr in (("retrive_next_token", nt), ("retrive_next_sibling", ns)):
        for i, x in enumerate(arr):
            if not is_int(x):
                raise InputError(f"{name}[{i}]: {brief(x)} is not an integer")
            if x < -1 or x >= n:
                raise InputError(f"{name}[{i}]: {brief(x)} is out of range (-1 to {n - 1})")
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


def from_sglang(retrive_next_token: Any, retrive_next_sibling: Any,
                log_probs: Any = None, *, probs: Any = None,
                tokens: Any = None) -> ProposalTree:
    """A ProposalTree from one request's SGLang arrays.

    Draft scores may cover all n nodes or only the n - 1 draft nodes (node 0, the
    verified token, then gets log-prob 0). With no scores the tree is structure only
    (every log-prob 0).
    """
    parents = retrieve_parent_token(retrive_next_token, retrive_next_sibling)
    n = len(parents)
    if log_probs is not None and probs is not None:
        raise InputError("give either 'probs' or 'log_probs', not both")
    if probs is not None:
        vals = as_list(probs, "probs")
        key = "probs"
    elif log_probs is not None:
        vals = as_list(log_probs, "log_probs")
        key = "log_probs"
    else:
        vals, key = [0.0] * n, "log_probs"
    if len(vals) == n - 1:
        vals = [1.0 if key == "probs" else 0.0] + list(vals)
    elif len(vals) != n:
        raise InputError(f"'{key}' has {len(vals)} entries; expected {n} (every node) "
                         f"or {n - 1} (the draft nodes after node 0)")
    if tokens is not None:
        tokens = as_list(tokens, "tokens")
    if key == "probs":
        return ProposalTree.from_probs(parents, vals, tokens)
    return ProposalTree(parents, vals, tokens)

