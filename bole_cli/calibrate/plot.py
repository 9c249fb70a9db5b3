"""The calibration plot: T_ver / T_dec against N per batch size, the knee (B_ver) and the
decision marked: what to run at each batch and what it buys (docs/design.md §8)."""

from __future__ import annotations

import os
from pathlib import Path


def plot_path_for(profile_path: Path) -> Path:
    """profile.yaml -> profile.png beside it (a dotted model name keeps its dots)."""
    from bole_cli.profiles.io import PROFILE_SUFFIXES

    stem = profile_path.name
    for suffix in PROFILE_SUFFIXES:
        stem = stem.removesuffix(suffix)
    return profile_path.with_name(stem + ".png")


def _ratio_scale(ratios: list, eps: float):
    """A y scale, log of (ratio - base) with base just under the smallest ratio, so the
    band 1.00 - 1 + eps where the knees sit gets as much room as 1.1 - 2, yet ratios of
    10 still fit; and ticks for it."""
    import numpy as np

    eps = eps if eps > 0 else 0.05
    base = min(min(ratios, default=1.0), 1.0) - eps

    def forward(v):
        return np.log(np.maximum(np.asarray(v, dtype=float) - base, 1e-9))

    def inverse(v):
        return np.exp(np.asarray(v, dtype=float)) + base

    top = max(ratios, default=2.0)
    candidates = (1.0, 1 + eps / 2, 1 + eps, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100)
    ticks = [t for t in candidates if base < t <= top * 1.05] or [1.0]
    return forward, inverse, sorted(set(round(t, 4) for t in ticks))


def decision_mark(cfg: dict) -> "tuple[int, str] | None":
    """(N, text) of a bucket's decision on its curve: a tree at its budget, a chain at
    its size, labelled with what it buys ('chain d=6 2.64x'); None without a decision or
    for no speculation (nothing on the verify curve to mark)."""
    chosen = (cfg.get("decision") or {}).get("chosen")
    if not chosen or chosen.get("mode") == "none" or chosen.get("budget") not in cfg["n"]:
        return None
    return chosen["budget"], f"{chosen.get('label', chosen['mode'])} {chosen['speedup']:.2f}x"


def plot_profile(profile: dict, path: "str | os.PathLike[str]") -> Path:
    """One panel per KV bucket, one line per batch size; a circle marks B_ver (the knee
    of Eq. 12), a filled diamond the decision with its speedup over plain decoding, the
    dashed line the (1 + eps) threshold. Saved atomically."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from bole_cli.console import save_figure

    configs = profile.get("configs") or []
    kvs = sorted({c["kv_len"] for c in configs}) or [0]
    batches = sorted({c["batch"] for c in configs})
    fig = Figure(figsize=(4.2 * len(kvs) + 1.6, 3.8), layout="constrained")
    axes = fig.subplots(1, len(kvs), sharey=True, squeeze=False)[0]
    colors = {b: f"C{i % 10}" for i, b in enumerate(batches)}
    eps = float(profile.get("eps", 0.05))
    ratios = [t / c["t_dec"] for c in configs for t in c["t_ver"]]
    forward, inverse, ticks = _ratio_scale(ratios, eps)
    for ax, kv in zip(axes, kvs):
        for cfg in sorted((c for c in configs if c["kv_len"] == kv), key=lambda c: c["batch"]):
            ratio = [t / cfg["t_dec"] for t in cfg["t_ver"]]
            color = colors[cfg["batch"]]
            ax.plot(cfg["n"], ratio, "-", color=color, lw=1.4, label=f"batch {cfg['batch']}")
            i = cfg["n"].index(cfg["b_ver"])
            ax.plot([cfg["b_ver"]], [ratio[i]], "o", color=color, ms=7, mfc="none", mew=1.6)
            mark = decision_mark(cfg)
            if mark is not None:  # what to run here, and what it buys
                j = cfg["n"].index(mark[0])
                ax.plot([mark[0]], [ratio[j]], "D", color=color, ms=7)
                ax.annotate(mark[1], (mark[0], ratio[j]), textcoords="offset points",
                            xytext=(5, 4), fontsize=6.5, color=color, parse_math=False)
        ax.axhline(1 + eps, ls="--", color="0.4", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("function", functions=(forward, inverse))
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("tree tokens N (whole batch)")
        ax.set_title(f"KV {kv}")
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel("T_ver(N) / T_dec")
    handles, _ = axes[0].get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", ls="", mfc="none", color="0.3", label="B_ver (Eq. 12)"),
                Line2D([], [], marker="D", ls="", color="0.3", ms=7,
                       label="decision, speedup\nover plain decoding"),
                Line2D([], [], ls="--", color="0.4", label=f"1 + eps = {1 + eps:g}")]
    fig.legend(handles=handles, fontsize=7, loc="outside right upper")  # off the data
    prov = profile.get("provenance", {})
    kind = prov.get("kind", "?")
    label = "ESTIMATED (roofline model)" if kind == "estimated" else f"measured on {prov.get('device_name')}"
    if prov.get("partial"):
        label += ", PARTIAL"
    if profile.get("draft_vocab"):
        label += f", drafting over {profile['draft_vocab']:,} hot tokens"
    fig.suptitle(f"{profile.get('model')} on {profile.get('gpu')}: {label}", fontsize=10,
                 parse_math=False)
    return save_figure(fig, path)
