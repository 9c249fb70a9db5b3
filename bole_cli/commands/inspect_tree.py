"""`bole inspect-tree`: look at a draft tree, what a budget keeps, and the memory it costs.

bole_cli.inspection builds the report (`report`), draws it (`plot`) and holds the tree's Rich
renderables (`view`); this module renders them (docs/design.md §4). Only typer and the
report's defaults (a light module) are imported at module level so `bole --help` stays
instant.
"""

from __future__ import annotations

from typing import Optional

import typer

from bole_cli.commands import int_option
from bole_cli.inspection.report import MIN_PER_REQUEST, STATE_DTYPE, SYNTHETIC_DEFAULTS
from bole_cli.memory import FLOAT_DTYPES


def register(app: typer.Typer) -> None:
    app.command("inspect-tree")(inspect_tree)


def inspect_tree(
    tree_file: Optional[str] = typer.Argument(
        None, metavar="TREE_FILE", show_default=False,
        help="Tree file, JSON or YAML: 'parents' plus 'probs' or 'log_probs', optional "
             "'tokens' (ids or strings); a list of such trees is a batch."),
    sglang: Optional[str] = typer.Option(
        None, "--sglang", metavar="FILE", show_default=False,
        help="SGLang arrays instead: retrive_next_token, retrive_next_sibling and 'probs' "
             "or 'log_probs' (1-D for one request, \\[bs, n] for a batch)."),
    synthetic: bool = typer.Option(
        False, "--synthetic", help="A synthetic EAGLE-style beam tree instead of a file."),
    depth: Optional[int] = int_option(
        None, "--depth", show_default=False,
        help=f"--synthetic: draft levels below the verified token. \\[default: {SYNTHETIC_DEFAULTS['depth']}]"),
    topk: Optional[int] = int_option(
        None, "--topk", show_default=False,
        help=f"--synthetic: drafts per expansion. \\[default: {SYNTHETIC_DEFAULTS['topk']}]"),
    seed: Optional[int] = int_option(
        None, "--seed", show_default=False,
        help=f"--synthetic: random seed. \\[default: {SYNTHETIC_DEFAULTS['seed']}]"),
    requests: Optional[int] = int_option(
        None, "--requests", show_default=False,
        help=f"--synthetic: number of requests, seeds SEED, SEED+1, ... \\[default: {SYNTHETIC_DEFAULTS['requests']}]"),
    budget: Optional[int] = int_option(
        None, "--budget", "-N", show_default=False,
        help="Keep the N highest-scoring nodes of the whole batch; the rest show as pruned."),
    min_per_request: Optional[int] = int_option(
        None, "--min-per-request", show_default=False,
        help=f"With --budget: nodes of its best path every request keeps. \\[default: {MIN_PER_REQUEST}]"),
    max_per_request: Optional[int] = int_option(
        None, "--max-per-request", show_default=False,
        help="With --budget: the most nodes one request may keep."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", show_default=False,
        help="Show transient verify memory for this catalogue model (e.g. 9b) or config.json."),
    batch: Optional[int] = int_option(
        None, "--batch", "-b", show_default=False,
        help="With --model: requests in flight. \\[default: the requests given]"),
    nodes: Optional[int] = int_option(
        None, "--nodes", "-T", show_default=False,
        help="With --model: draft nodes per request. \\[default: the most any request "
             "verifies, after the budget]"),
    state_dtype: Optional[str] = typer.Option(
        None, "--state-dtype", show_default=False,
        help=f"With --model: recurrent state dtype, one of {', '.join(FLOAT_DTYPES)}. "
             f"\\[default: {STATE_DTYPE}]"),
    plot: Optional[str] = typer.Option(
        None, "--plot", metavar="FILE.png", show_default=False,
        help="Draw the tree(s) to FILE (.png, .svg or .pdf); pruned nodes are grey."),
    json_out: bool = typer.Option(False, "--json", help="Print everything as JSON."),
) -> None:
    """Inspect a proposal tree: structure, path scores, budget selection, memory."""
    from bole_cli.inspection.report import inspect_trees

    result = inspect_trees(tree_file=tree_file, sglang=sglang, synthetic=synthetic, depth=depth,
                           topk=topk, seed=seed, requests=requests, budget=budget,
                           min_per_request=min_per_request, max_per_request=max_per_request,
                           model=model, batch=batch, nodes=nodes, state_dtype=state_dtype,
                           plot=plot)
    if json_out:
        from bole_cli.console import emit_json

        emit_json(result.report)
    else:
        _render(result.trees, result.report, result.selection, result.memory)
        if plot is not None:
            from bole_cli.console import out

            out.print(f"plot: {result.report['plot']}", markup=False)


# ---- Rich view --------------------------------------------------------------------------------

def _render(trees, report, selection, memory) -> None:
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    from bole_cli.console import out
    from bole_cli.inspection.report import DRAW_MAX_NODES
    from bole_cli.inspection.view import mask_renderable, tree_renderable

    src = report["source"]
    s = report["summary"]
    reqs = f"{s['requests']} request{'s' if s['requests'] != 1 else ''}"
    if src["kind"] == "synthetic":  # two short lines: no wrap lands inside "seed 0"
        out.print(f"[bold]synthetic EAGLE-style beam (seed {src['seed']})[/]: {reqs}, "
                  f"{s['nodes']} nodes")
        out.print(f"depth {src['depth']} below the verified token \\[0], top-k {src['topk']}")
    else:
        what = f"{'SGLang arrays' if src['kind'] == 'sglang' else 'tree file'} {src['path']}"
        out.print(f"[bold]{escape(what)}[/]: {reqs}, {s['nodes']} nodes")

    drawn = 0
    for r, t in zip(report["requests"], trees):
        if drawn and drawn + t.n_nodes > DRAW_MAX_NODES:
            rest = len(trees) - r["index"]
            out.print(f"[dim]{rest} more request{'s' if rest != 1 else ''} not drawn (over "
                      f"{DRAW_MAX_NODES} nodes): the summary below counts them; --json "
                      "lists every node[/]")
            break
        title = f"[bold]request {r['index']}[/] [dim](committed prefix)[/]"
        out.print(tree_renderable(t, r["kept"], title))
        drawn += t.n_nodes

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
    out.print("[dim]depth: draft levels below the verified token \\[0] (as --depth); width "
              "per level: nodes at each depth from 0. exp. acc. (expected accepted "
              "tokens) = sum of rho over the nodes: the tokens a verify is expected to emit "
              "when rho is the acceptance probability.[/]")
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
            out.print(Panel.fit(mask_renderable(r["ancestor_mask"]),
                                title=f"request {r['index']}: ancestor mask (row attends to column)",
                                title_align="left", border_style="dim"))

    if memory:
        _render_memory(memory)


def _render_memory(m) -> None:
    from rich.table import Table

    from bole_cli.console import out, shown_text
    from bole_cli.memory import format_bytes

    out.print(f"[bold]Transient verify memory[/]: {shown_text(m.model)}")
    out.print(f"{m.batch} request{'s' if m.batch != 1 else ''} in flight, each verifying "
              f"up to {m.nodes} node{'s' if m.nodes != 1 else ''} (SGLang sizes every "
              f"slot for that many), {m.state_dtype} state, {m.gdn_layers} GDN layers")
    table = Table(show_edge=False)
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
