"""`bole inspect-tree`: look at a draft tree, what a budget keeps, and the memory it costs.

Only typer is imported at module level so `bole --help` stays instant; trees, budget,
memory, Rich renderables and matplotlib load inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

MASK_MAX_NODES = 32  # the ancestor mask is shown for trees up to this size
_PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def register(app: typer.Typer) -> None:
    app.command("inspect-tree")(inspect_tree)


def inspect_tree(
    tree_file: Optional[Path] = typer.Argument(
        None, metavar="TREE_FILE", show_default=False,
        help="Tree file, JSON or YAML: 'parents' plus 'probs' or 'log_probs', optional "
             "'tokens' (ids or strings); a list of such trees is a batch."),
    sglang: Optional[Path] = typer.Option(
        None, "--sglang", metavar="FILE", show_default=False,
        help="SGLang arrays instead: retrive_next_token, retrive_next_sibling and 'probs' "
             "or 'log_probs' (1-D for one request, \\[bs, n] for a batch)."),
    synthetic: bool = typer.Option(
        False, "--synthetic", help="A synthetic EAGLE-style beam tree instead of a file."),
    depth: Optional[int] = typer.Option(
        None, "--depth", show_default=False,
        help="--synthetic: draft levels below the verified token. \\[default: 8]"),
    topk: Optional[int] = typer.Option(
        None, "--topk", show_default=False, help="--synthetic: drafts per expansion. \\[default: 4]"),
    seed: Optional[int] = typer.Option(
        None, "--seed", show_default=False, help="--synthetic: random seed. \\[default: 0]"),
    requests: Optional[int] = typer.Option(
        None, "--requests", show_default=False,
        help="--synthetic: number of requests, seeds SEED, SEED+1, ... \\[default: 1]"),
    budget: Optional[int] = typer.Option(
        None, "--budget", "-N", show_default=False,
        help="Keep the N highest-scoring nodes of the whole batch; the rest show as pruned."),
    min_per_request: Optional[int] = typer.Option(
        None, "--min-per-request", show_default=False,
        help="With --budget: nodes of its best path every request keeps. \\[default: 1]"),
    max_per_request: Optional[int] = typer.Option(
        None, "--max-per-request", show_default=False,
        help="With --budget: the most nodes one request may keep."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", show_default=False,
        help="Show transient verify memory for this catalogue model (e.g. 9b) or config.json."),
    batch: Optional[int] = typer.Option(
        None, "--batch", "-b", show_default=False,
        help="With --model: requests in flight. \\[default: the requests given]"),
    nodes: Optional[int] = typer.Option(
        None, "--nodes", "-T", show_default=False,
        help="With --model: draft nodes per request. \\[default: the most any request "
             "verifies, after the budget]"),
    state_dtype: Optional[str] = typer.Option(
        None, "--state-dtype", show_default=False,
        help="With --model: recurrent state dtype, float32 or bfloat16. \\[default: float32]"),
    plot: Optional[Path] = typer.Option(
        None, "--plot", metavar="FILE.png", show_default=False,
        help="Draw the tree(s) to FILE (.png, .svg or .pdf); pruned nodes are grey."),
    json_out: bool = typer.Option(False, "--json", help="Print everything as JSON."),
) -> None:
    """Inspect a proposal tree: structure, path scores, budget selection, memory."""
    from bole_cli.errors import InputError

    # ---- check the combination of options before any work ----------------------------
    sources = [name for name, given in (("TREE_FILE", tree_file is not None),
                                         ("--sglang", sglang is not None),
                                         ("--synthetic", synthetic)) if given]
    if len(sources) != 1:
        which = "none" if not sources else " and ".join(sources)
        raise InputError(f"give exactly one of TREE_FILE, --sglang FILE or --synthetic (got {which})")
    if not synthetic:
        for flag, value in (("--depth", depth), ("--topk", topk), ("--seed", seed),
                            ("--requests", requests)):
            if value is not None:
                raise InputError(f"{flag} only applies with --synthetic")
    if budget is None:
        for flag, value in (("--min-per-request", min_per_request),
                            ("--max-per-request", max_per_request)):
            if value is not None:
                raise InputError(f"{flag} only applies with --budget")
    if model is None:
        for flag, value in (("--batch", batch), ("--nodes", nodes), ("--state-dtype", state_dtype)):
            if value is not None:
                raise InputError(f"{flag} only applies with --model")
    if plot is not None and plot.suffix.lower() not in _PLOT_SUFFIXES:
        raise InputError(f"--plot {plot}: unsupported file type {plot.suffix or '(none)'!r}; "
                         "use .png, .svg or .pdf")

    trees, source = _load(tree_file, sglang, synthetic, depth, topk, seed, requests)

    selection = None
    if budget is not None:
        from bole_cli.budget import select_budget

        selection = select_budget(trees, budget,
                                  min_per_request=1 if min_per_request is None else min_per_request,
                                  max_per_request=max_per_request)

    memory = None
    if model is not None:
        from bole_cli.catalog.models import resolve_model
        from bole_cli.memory import transient_memory

        spec = resolve_model(model)
        if nodes is None:
            sizes = selection.forest.sizes if selection else [t.n_nodes for t in trees]
            nodes = max(max(sizes), 1)
        memory = transient_memory(spec, len(trees) if batch is None else batch, nodes,
                                  state_dtype or "float32")

    report = _report(trees, source, selection, memory)
    if plot is not None:
        report["plot"] = str(_plot(trees, selection, plot))

    if json_out:
        from bole_cli.console import emit_json

        emit_json(report)
    else:
        _render(trees, report, selection, memory)
        if plot is not None:
            from bole_cli.console import out

            out.print(f"plot: {report['plot']}", markup=False)


# ---- input ----------------------------------------------------------------------------------

def _load(tree_file, sglang, synthetic, depth, topk, seed, requests):
    from bole_cli.errors import InputError
    from bole_cli import trees as T

    if tree_file is not None:
        return T.load_trees(tree_file), {"kind": "file", "path": str(tree_file)}
    if sglang is not None:
        return T.load_sglang(sglang), {"kind": "sglang", "path": str(sglang)}
    depth = 8 if depth is None else depth
    topk = 4 if topk is None else topk
    seed = 0 if seed is None else seed
    requests = 1 if requests is None else requests
    if requests < 1:
        raise InputError(f"--requests must be >= 1, got {requests}")
    try:
        trees = [T.beam_tree(depth, topk, seed + r) for r in range(requests)]
    except InputError as exc:
        raise InputError(f"--synthetic: {exc}") from None
    return trees, {"kind": "synthetic", "depth": depth, "topk": topk, "seed": seed,
                   "requests": requests}


# ---- the report (the JSON, and what the Rich view reads) -------------------------------------

def _report(trees, source, selection, memory) -> dict[str, Any]:
    reqs = []
    for b, t in enumerate(trees):
        kept = selection.kept_mask(b, t.n_nodes) if selection else None
        reqs.append({
            "index": b,
            "nodes": t.n_nodes,
            "depth": t.depth,
            "widths": list(t.widths),
            "parents": list(t.parents),
            "log_probs": list(t.log_probs),
            "probs": list(t.probs),
            "log_rho": list(t.log_rho),
            "rho": list(t.rho),
            "depths": list(t.depths),
            "tokens": None if t.tokens is None else list(t.tokens),
            "expected_accepted": t.expected_accepted(),
            "kept": kept,
            "kept_nodes": len(selection.kept_ids[b]) if selection else None,
            "expected_accepted_budget": selection.expected_accepted[b] if selection else None,
            "ancestor_mask": t.ancestor_mask() if t.n_nodes <= MASK_MAX_NODES else None,
        })
    max_depth = max(t.depth for t in trees)
    widths = [0] * max_depth
    for t in trees:
        for d, w in enumerate(t.widths):
            widths[d] += w
    summary = {
        "requests": len(trees),
        "nodes": sum(t.n_nodes for t in trees),
        "depth": max_depth,
        "widths": widths,
        "expected_accepted": sum(r["expected_accepted"] for r in reqs),
        "kept_nodes": selection.n_kept if selection else None,
        "expected_accepted_budget": sum(selection.expected_accepted) if selection else None,
    }
    return {
        "source": source,
        "requests": reqs,
        "summary": summary,
        "budget": selection.to_dict() if selection else None,
        "memory": memory.to_dict() if memory else None,
        "plot": None,
    }


# ---- Rich view --------------------------------------------------------------------------------

def _node_label(t, i: int, kept: Optional[bool]):
    from rich.text import Text

    label = Text()
    pruned = kept is False
    label.append(f"[{i}]", style="dim" if pruned else "bold cyan")
    if t.tokens is not None:
        tok = t.tokens[i]
        label.append(" ")
        label.append(f"id {tok}" if isinstance(tok, int) else repr(tok),
                     style="dim" if pruned else "bold")
    label.append(f"  p={t.probs[i]:.3g}  ρ={t.rho[i]:.3g}  d={t.depths[i]}",
                 style="dim" if pruned else "")
    if pruned:
        label.append("  pruned", style="dim italic")
    return label


def _rich_tree(t, b: int, kept: Optional[list[bool]], title: str):
    from rich.tree import Tree

    root = Tree(title, guide_style="dim")
    handles = {}
    for i, p in enumerate(t.parents):  # parents come first, so handles[p] exists
        parent = root if p < 0 else handles[p]
        k = None if kept is None else kept[i]
        handles[i] = parent.add(_node_label(t, i, k),
                                guide_style="dim" if k is False else "")
    return root


def _mask_text(mask: list[list[bool]]):
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


def _render(trees, report, selection, memory) -> None:
    from rich.panel import Panel
    from rich.table import Table

    from bole_cli.console import out

    src = report["source"]
    if src["kind"] == "synthetic":
        what = (f"synthetic EAGLE-style beam: depth {src['depth']}, top-k {src['topk']}, "
                f"seed {src['seed']}")
    else:
        what = f"{'SGLang arrays' if src['kind'] == 'sglang' else 'tree file'} {src['path']}"
    s = report["summary"]
    out.print(f"[bold]{what}[/]: {s['requests']} request(s), {s['nodes']} nodes")

    for r, t in zip(report["requests"], trees):
        title = f"[bold]request {r['index']}[/] [dim](committed prefix)[/]"
        out.print(_rich_tree(t, r["index"], r["kept"], title))

    table = Table(title="Summary", title_justify="left", show_edge=False)
    table.add_column("request", justify="right")
    table.add_column("nodes", justify="right")
    table.add_column("depth", justify="right")
    table.add_column("width per level", overflow="fold", min_width=12)
    table.add_column("exp. acc.", justify="right")
    if selection:
        table.add_column("kept", justify="right")
        table.add_column("kept exp. acc.", justify="right")
    rows = list(report["requests"])
    for r in rows:
        cells = [str(r["index"]), str(r["nodes"]), str(r["depth"]),
                 " ".join(map(str, r["widths"])), f"{r['expected_accepted']:.3f}"]
        if selection:
            cells += [str(r["kept_nodes"]), f"{r['expected_accepted_budget']:.3f}"]
        table.add_row(*cells)
    if len(rows) > 1:
        cells = ["all", str(s["nodes"]), str(s["depth"]), " ".join(map(str, s["widths"])),
                 f"{s['expected_accepted']:.3f}"]
        if selection:
            cells += [str(s["kept_nodes"]), f"{s['expected_accepted_budget']:.3f}"]
        table.add_row(*cells, style="bold")
    out.print(table)
    out.print("[dim]exp. acc. (expected accepted tokens) = sum of rho over the nodes: the tokens a verify is "
              "expected to emit when rho is the acceptance probability.[/]")
    if selection:
        full, kept = s["expected_accepted"], s["expected_accepted_budget"]
        share = kept / full if full else 1.0
        cap = f", at most {selection.max_per_request} per request" if selection.max_per_request else ""
        out.print(f"budget {selection.budget} over {selection.candidates} candidates "
                  f"(at least {selection.min_per_request} per request{cap}): kept "
                  f"{selection.n_kept} nodes, expected accepted {full:.3f} -> {kept:.3f} "
                  f"({share:.1%})")

    for r in report["requests"]:
        if r["ancestor_mask"] is not None:
            out.print(Panel.fit(_mask_text(r["ancestor_mask"]),
                                title=f"request {r['index']}: ancestor mask (row attends to column)",
                                title_align="left", border_style="dim"))

    if memory:
        _render_memory(memory)


def _render_memory(m) -> None:
    from rich.table import Table

    from bole_cli.console import out
    from bole_cli.memory import format_bytes

    table = Table(title=(f"Transient verify memory: {m.model}, batch {m.batch} x {m.nodes} "
                         f"nodes, {m.state_dtype} state, {m.gdn_layers} GDN layers"),
                  title_justify="left", show_edge=False)
    table.add_column("")
    table.add_column("SGLang snapshots", justify="right")
    table.add_column("Bole factors", justify="right")
    table.add_column("ratio", justify="right")
    for name, snap, fact in (
            ("per node, per layer", m.snapshot_bytes_per_node_layer, m.factor_bytes_per_node_layer),
            ("per layer", m.snapshot_bytes_per_layer, m.factor_bytes_per_layer),
            ("whole model", m.snapshot_bytes, m.factor_bytes)):
        table.add_row(name, format_bytes(snap), format_bytes(fact), f"{snap / fact:.1f}x")
    out.print(table)
    shape = "x".join(map(str, m.sglang_buffer_shape))
    out.print(f"the difference, {format_bytes(m.saved_bytes)}, holds "
              f"[bold]{m.kv_tokens_bought:,}[/] KV-cache tokens at "
              f"{format_bytes(m.kv_bytes_per_token)} per token ({m.kv_dtype})")
    out.print(f"SGLang's intermediate snapshot buffer [{shape}] {m.state_dtype}: "
              f"[bold]{format_bytes(m.sglang_buffer_bytes)}[/] preallocated for {m.slots} slots "
              f"(+1), {m.kv_tokens_freed:,} KV-cache tokens once Bole drops it")


# ---- plot -------------------------------------------------------------------------------------

def _layout(t) -> tuple[list[float], float]:
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


def _plot(trees, selection, path: Path) -> Path:
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
        x, x_prefix = _layout(t)
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
        if small:
            for i in range(t.n_nodes):
                ax.annotate(str(i), (x[i], y[i]), ha="center", va="center", fontsize=6,
                            color="white" if kept[i] and t.rho[i] < 0.3 else "black", zorder=4)
                if t.tokens is not None:
                    tok = t.tokens[i]
                    ax.annotate(str(tok) if isinstance(tok, int) else repr(tok), (x[i], y[i]),
                                textcoords="offset points", xytext=(0, -11), ha="center",
                                fontsize=6, color="black" if kept[i] else "0.6")
        title = (f"request {b}: {t.n_nodes} nodes, depth {t.depth}\n"
                 f"expected accepted {t.expected_accepted():.2f}")
        if selection:
            title += (f" -> {selection.expected_accepted[b]:.2f} "
                      f"keeping {len(selection.kept_ids[b])}")
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_yticks([-d for d in range(0, t.depth + 1)])
        ax.set_yticklabels(["prefix"] + [str(d) for d in range(1, t.depth + 1)], fontsize=7)
        ax.set_ylabel("depth", fontsize=8)
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
