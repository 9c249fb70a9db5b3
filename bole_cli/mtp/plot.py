"""The figure `bole acceptance` saves: q[d][r] as a heat map (with each cell's value), and
the expected committed tokens per step against the tree budget, the chain marked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence


def plot_acceptance(q: Sequence[Sequence[float]], budgets: Sequence[int], trees: Sequence[float],
                    chain: float, chain_measured: float, title: str,
                    path: "str | os.PathLike[str]") -> Path:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    from bole_cli.console import save_figure

    depth, topk = len(q), len(q[0]) if q else 0
    fig = Figure(figsize=(9.0, 3.8))
    ax_q, ax_e = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(topk, 2), 4]})
    im = ax_q.imshow(q, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for d in range(depth):
        for r in range(topk):
            ax_q.text(r, d, f"{q[d][r]:.2f}", ha="center", va="center", fontsize=7,
                      color="white" if q[d][r] < 0.6 else "black")
    ax_q.set_xticks(range(topk), [str(r + 1) for r in range(topk)])
    ax_q.set_yticks(range(depth), [str(d + 1) for d in range(depth)])
    ax_q.set_xlabel("rank among the MTP's top-k")
    ax_q.set_ylabel("draft depth")
    ax_q.set_title("q[d][r]", fontsize=9)
    fig.colorbar(im, ax=ax_q, fraction=0.08)
    ax_e.plot(list(budgets), list(trees), "o-", lw=1.4, label="best tree of n tokens")
    ax_e.axhline(chain, ls="--", color="C1", lw=1, label=f"chain of {depth} (matrix) {chain:.2f}")
    ax_e.axhline(chain_measured, ls=":", color="C2", lw=1,
                 label=f"chain of {depth} (measured) {chain_measured:.2f}")
    ax_e.set_xscale("log", base=2)
    ax_e.set_xticks(list(budgets), [str(b) for b in budgets])
    ax_e.set_xlabel("tree tokens per request n (root included)")
    ax_e.set_ylabel("committed tokens per step")
    ax_e.legend(fontsize=7, loc="lower right")
    ax_e.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
