"""Proposal trees (docs/design.md §4) and their packed form, the kernels' tree arrays (§3).

- `tree`: :class:`ProposalTree`, one request's draft, its checks, queries and path scores.
- `forest`: :class:`Forest`, a batch packed back to back (`pack_forest`).
- `sglang_links`: SGLang's first-child / next-sibling links <-> Bole's parents (§6).
- `files`: reading and writing tree files (Bole's format and SGLang's arrays).
- `generators`: chains, EAGLE-style beam trees and random trees for tests and benches.

Pure Python: torch is imported only inside the ``*_tensor`` / ``to_torch`` helpers.
"""

from __future__ import annotations

from bole_cli.trees.files import dump_trees, load_sglang, load_trees, parse_trees
from bole_cli.trees.forest import Forest, pack_forest
from bole_cli.trees.generators import (
    TREE_SHAPES,
    beam_tree,
    beam_tree_size,
    check_beam_tree_size,
    chain_tree,
    random_forest,
    random_tree,
)
from bole_cli.trees.sglang_links import SGLangTree, from_sglang, retrieve_parent_token, to_sglang
from bole_cli.trees.tree import ProposalTree

__all__ = [
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
    "check_beam_tree_size",
    "random_tree",
    "random_forest",
    "TREE_SHAPES",
]
