"""Which of tree_verify's two kernels a launch takes and a launch config is for
(docs/design.md §3): the one-tile kernel when the largest tree is promised and fits one
tile (at most MAX_TILE_NODES nodes), else the blocked kernel.

The launch configs, the shape buckets and the tuned-table lookup all split on this, so it
lives below them.
"""

from __future__ import annotations

from typing import Mapping

from bole_cli.limits import MAX_TILE_NODES


def is_tile_launch(shape: Mapping) -> bool:
    """True when tree_verify takes the one-tile kernel: the largest tree ("T") is known and
    at most MAX_TILE_NODES."""
    return 0 < int(shape.get("T", 0) or 0) <= MAX_TILE_NODES


def is_blocked_config(config: Mapping[str, int]) -> bool:
    """A tree_verify config for the blocked kernel (it names BC and not VSPLIT)."""
    return "BC" in config and "VSPLIT" not in config
