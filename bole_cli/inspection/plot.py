"""Drawing draft trees: a tidy layout and the matplotlib figure of `bole inspect-tree --plot`.

matplotlib loads inside `plot_trees` only: bole_cli.inspection.report reads PLOT_SUFFIXES from
here to check --plot before any work. Scores and budgets: docs/design.md §4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def tidy_layout(t) -> tuple[list[float], float]:
    """Tidy x positions: leaves left to right in depth-first order, parents centred over
    their children. Returns the node positions and the prefix's (above the roots)."""
    x = [0.0] * t.n_nodes
    next_leaf = 0.0
    order: list[int] = []
    stack = list(reversed(t.roots))
    while stack:  # pre-order, children ascending
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(t.children[i]))
    for i in order:
        if not t.children[i]:
            x[i] = next_leaf
            next_leaf += 1.0
    for i in reversed(order):  # children before parents
        kids = t.children[i]
        if kids:
            x[i] = (x[kids[0]] + x[kids[-1]]) / 2
    roots = t.roots
    return x, (x[roots[0]] + x[roots[-1]]) / 2


def plot_trees(trees: Sequence, selection: Any, path: Path) -> Path:
    """Draw every request's tree in one figure (up to two panels a row) to `path`:
    nodes coloured by path score on a log scale, pruned nodes grey and dashed."""
    import math

    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    from bole_cli.console import save_figure

    n_req = len(trees)
    ncols = min(n_req, 2)
    nrows = math.ceil(n_req / ncols)
    leaves = max(sum(1 for c in t.children if not c) for t in trees)
    depth = max(t.depth for t in trees)
    panel_w = min(max(4.0, 0.3 * leaves), 30.0)
    panel_h = min(max(2.5, 0.75 * (depth + 1)), 12.0)
    fig = Figure(figsize=(panel_w * ncols, panel_h * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    cmap = colormaps["viridis"]
    # colour over the scores actually drawn in colour (kept nodes), floored so one
    # near-zero draft does not wash the rest out
    shown = [r for b, t in enumerate(trees) for i, r in enumerate(t.rho)
             if selection is None or i in selection.kept_ids[b]]
    norm = LogNorm(vmin=min(max(min(shown, default=1e-3), 1e-6), 0.999), vmax=1.0, clip=True)

    for b, t in enumerate(trees):
        ax = axes[b // ncols][b % ncols]
        x, x_prefix = tidy_layout(t)
        y = [-d for d in t.depths]
        kept = selection.kept_mask(b, t.n_nodes) if selection else [True] * t.n_nodes
        small = t.n_nodes <= 64
        for i, p in enumerate(t.parents):
            px, py = (x_prefix, 0) if p < 0 else (x[p], y[p])
            ax.plot([px, x[i]], [py, y[i]], color="0.35" if kept[i] else "0.85",
                    lw=1.0 if kept[i] else 0.8, ls="-" if kept[i] else "--", zorder=1)
        ax.scatter([x_prefix], [0], marker="s", s=60, color="black", zorder=3)
        ax.annotate("prefix", (x_prefix, 0), textcoords="offset points", xytext=(8, 0),
                    va="center", fontsize=8)
        colours = [cmap(norm(r)) if k else "0.85"
                   for r, k in zip(t.rho, kept)]
        ax.scatter(x, y, s=120 if small else 40, c=colours, zorder=3,
                   edgecolors=["black" if k else "0.6" for k in kept], linewidths=0.6)
        for i in range(t.n_nodes):  # node ids, as in the text tree ([i])
            if small:
                ax.annotate(str(i), (x[i], y[i]), ha="center", va="center", fontsize=6,
                            color="white" if kept[i] and t.rho[i] < 0.3 else "black",
                            zorder=4)
            else:  # too small a marker to hold the id: write it above
                ax.annotate(str(i), (x[i], y[i]), textcoords="offset points", xytext=(0, 5),
                            ha="center", fontsize=4, color="black" if kept[i] else "0.6",
                            zorder=4)
            if small and t.tokens is not None:
                tok = t.tokens[i]
                # parse_math=False: a token such as "$$" is text, not matplotlib math
                ax.annotate(str(tok) if isinstance(tok, int) else repr(tok), (x[i], y[i]),
                            textcoords="offset points", xytext=(0, -11), ha="center",
                            fontsize=6, color="black" if kept[i] else "0.6",
                            parse_math=False)
        title = (f"request {b}: {t.n_nodes} nodes, depth {t.draft_depth}\n"
                 f"expected accepted {t.expected_accepted():.2f}")
        if selection:
            title += (f" -> {selection.expected_accepted[b]:.2f} "
                      f"keeping {len(selection.kept_ids[b])}")
        ax.set_title(title, fontsize=9, loc="left", parse_math=False)
        ax.set_yticks([-d for d in range(0, t.depth + 1)])
        ax.set_yticklabels(["prefix"] + [str(d) for d in range(0, t.depth)], fontsize=7)
        ax.set_ylabel("depth (0: the verified token)", fontsize=8)
        ax.set_xticks([])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        ax.margins(x=0.03, y=0.08)
    for k in range(n_req, nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, shrink=0.6, pad=0.01,
                       aspect=30)
    ticks = [v for v in (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 1e-3, 1e-4, 1e-5, 1e-6)
             if v >= norm.vmin]
    bar.set_ticks(ticks, labels=[f"{v:g}" for v in ticks])
    bar.ax.minorticks_off()
    bar.set_label("path score ρ (grey: pruned by the budget)" if selection else "path score ρ",
                  fontsize=8)
    return save_figure(fig, path)
