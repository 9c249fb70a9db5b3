"""Rich renderables of a draft tree for `bole inspect-tree`: the tree, the ancestor mask.

Rich loads inside the functions. Path scores and masks: docs/design.md §2, §4.
"""

from __future__ import annotations

from typing import Optional


def node_label(t, i: int, kept: Optional[bool], probs=None, rho=None, depths=None):
    """One node's line: id, token, probability, path score rho, draft depth (the root, the
    verified token, is 0: ProposalTree.draft_depth); dim when pruned.
    `probs`, `rho`, `depths`: the tree's, computed once by a caller that labels every node
    (each is a pass over the tree)."""
    from rich.text import Text

    probs = t.probs if probs is None else probs
    rho = t.rho if rho is None else rho
    depths = t.depths if depths is None else depths
    label = Text()
    pruned = kept is False
    label.append(f"[{i}]", style="dim" if pruned else "bold cyan")
    if t.tokens is not None:
        tok = t.tokens[i]
        label.append(" ")
        label.append(f"id {tok}" if isinstance(tok, int) else repr(tok),
                     style="dim" if pruned else "bold")
    label.append(f"  p={probs[i]:.3g}  ρ={rho[i]:.3g}  d={depths[i] - 1}",
                 style="dim" if pruned else "")
    if pruned:
        label.append("  pruned", style="dim italic")
    return label


def tree_renderable(t, kept: Optional[list[bool]], title: str):
    """The tree under `title` (the committed prefix), one line per node."""
    from rich.tree import Tree

    root = Tree(title, guide_style="dim")
    handles = {}
    probs, rho, depths = t.probs, t.rho, t.depths
    for i, p in enumerate(t.parents):  # parents come first, so handles[p] exists
        parent = root if p < 0 else handles[p]
        k = None if kept is None else kept[i]
        handles[i] = parent.add(node_label(t, i, k, probs, rho, depths),
                                guide_style="dim" if k is False else "")
    return root


def mask_renderable(mask: list[list[bool]]):
    """The ancestor mask as a grid: row i attends to column j where it is filled."""
    from rich.text import Text

    n = len(mask)
    text = Text()
    text.append("     " + "".join(str(j % 10) for j in range(n)) + "\n", style="dim")
    for i, row in enumerate(mask):
        text.append(f"{i:>4} ", style="dim")
        for j, v in enumerate(row):
            text.append("■" if v else "·", style="cyan" if v and j != i else
                        ("bold" if v else "dim"))
        if i < n - 1:
            text.append("\n")
    return text
