"""`bole acceptance --model DIR --prompts FILE.jsonl`: how the model's own MTP head is
accepted on the user's prompts, measured; written as an acceptance file.

bole_cli.mtp.run does the work (docs/design.md §8): transformers loads the local checkpoint,
Bole's MTP module its `mtp.*` layer, and teacher forcing along the target's greedy
continuation gives q[d][r] with intervals. This module parses the options, shows progress,
and renders the matrix and the expected committed tokens of a chain and of trees.
`bole calibrate --acceptance FILE` and `bole bench e2e --acceptance FILE` read the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import ContextManager, Optional

import typer

from bole_cli.commands import int_option, path_value
from bole_cli.mtp.run import DEFAULT_DEPTH, DEFAULT_MAX_NEW, DEFAULT_TOPK


def _progress(total: int) -> ContextManager:
    from bole_cli.console import progress_bar

    return progress_bar(total, "measuring")


def _matrix_table(result):
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    tally, doc = result.tally, result.document
    lo = doc["measurement"]["interval"]["lower"]
    hi = doc["measurement"]["interval"]["upper"]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, caption_justify="left",
              title=escape("q[d][r]: P(rank-r draft is the target's token | depths < d hit)"),
              title_justify="left",
              caption="+-: half-width of the 95% Wilson interval. n: positions reaching "
                      "depth d (every earlier depth in the top-k).")
    t.add_column("depth", justify="right", no_wrap=True)
    t.add_column("n", justify="right", no_wrap=True)
    ranks = min(tally.topk, 4)  # the top-k column sums them all; the file has every rank
    for r in range(ranks):
        t.add_column(f"rank {r + 1}", justify="right", no_wrap=True)
    t.add_column("top-k", justify="right", no_wrap=True)
    for d, row in enumerate(result.model.q):
        if not tally.trials[d]:
            t.add_row(str(d + 1), "0", *(["-"] * ranks), "-")
            continue
        cells = [f"{row[r]:.3f}±{(hi[d][r] - lo[d][r]) / 2:.3f}".replace("±0.", "±.")
                 for r in range(ranks)]
        t.add_row(str(d + 1), str(tally.trials[d]), *cells, f"{sum(row):.3f}")
    return t


def _expected_table(result):
    from rich import box
    from rich.table import Table

    e = result.document["expected"]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, title_justify="left",
              title="expected committed tokens per step (bonus token included)")
    t.add_column("draft", overflow="fold")  # wraps first, so no figure is cut when narrow
    t.add_column("tokens/step", justify="right", no_wrap=True)
    t.add_row(f"chain of {result.tally.depth}, from the matrix", f"{e['chain']:.3f}")
    t.add_row(f"chain of {result.tally.depth}, measured", f"{e['chain_measured']:.3f}")
    for n, v in e["trees"].items():
        t.add_row(f"best tree of {n} tokens", f"{v:.3f}")
    return t


def acceptance(
    model: str = typer.Option(..., "--model", help="Local Hugging Face checkpoint directory "
                              "(Qwen3.5 / Qwen3-Next, with its mtp.* weights and tokenizer)."),
    prompts: str = typer.Option(..., "--prompts", help="JSON lines: {\"prompt\": ...} or "
                                "{\"messages\": [...]} per line."),
    depth: int = int_option(DEFAULT_DEPTH, "--depth", help="Draft depths to measure."),
    topk: int = int_option(DEFAULT_TOPK, "--topk", help="Ranks per depth (the tree's top-k)."),
    max_new: int = int_option(DEFAULT_MAX_NEW, "--max-new",
                              help="Greedy continuation tokens per prompt."),
    device: Optional[str] = typer.Option(None, "--device",
                                         help="cuda or cpu (default: cuda when present)."),
    out: Optional[Path] = typer.Option(None, "--out", parser=path_value, metavar="FILE", help="Acceptance file to write "
                                       "(.yaml or .json; default: the cache's acceptance/acceptance-<model>.yaml)."),
    no_plot: bool = typer.Option(False, "--no-plot", help="Save no PNG next to the file."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Measure the model's own MTP acceptance per draft depth and rank on your prompts.

    Writes the acceptance file that calibrate and bench e2e read (--acceptance FILE)."""
    from rich.markup import escape

    from bole_cli.console import emit_json, err, out as console, shell_lines
    from bole_cli.mtp.run import AcceptanceOptions, run_acceptance

    opts = AcceptanceOptions(model=model, prompts=prompts, depth=depth, topk=topk,
                             max_new=max_new, device=device, out=out, plot=not no_plot)
    result = run_acceptance(opts, progress=None if json_out else _progress)
    if json_out:
        emit_json({"path": str(result.path),
                   "plot": str(result.plot_path) if result.plot_path else None,
                   "notes": result.notes, "acceptance": result.document})
    else:
        m = result.document["measurement"]
        console.print(f"[bold]{escape(result.document['name'])}[/]: {m['anchors']} positions "
                      f"from {m['prompts']['used']} prompt{'s' * (m['prompts']['used'] != 1)}, {m['device']}, {m['dtype']}")
        console.print(_matrix_table(result))
        console.print(_expected_table(result))
        for note in result.notes:
            err.print(f"[yellow]note:[/] {escape(note)}")
        console.print(f"acceptance: {escape(str(result.path))}")
        if result.plot_path:
            console.print(f"plot:       {escape(str(result.plot_path))}")
        lines = shell_lines(_next_command(m, result.path), width=console.width - len("next: "))
        for line in ["next: " + lines[0]] if len(lines) == 1 else ["next:", *lines]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if result.interrupted:
        from bole_cli.interrupts import exit_code, reason

        err.print(f"[yellow]{reason()}:[/] partial acceptance file written to "
                  f"{escape(str(result.path))}")
        raise typer.Exit(exit_code())


def _next_command(measurement: dict, path) -> list[str]:
    """calibrate with this file, for the checkpoint measured and the GPU it ran on (a GPU
    the catalogue does not know, or the CPU, is left for the user to name: GPU)."""
    from bole_cli.catalog.hardware import match_gpu

    gpu = match_gpu(measurement["device"]) if measurement["device"] != "cpu" else None
    return ["bole", "calibrate", "--gpu", gpu.key if gpu else "GPU", "--model", measurement["checkpoint"],
            "--acceptance", str(path)]


def register(app: typer.Typer) -> None:
    app.command("acceptance")(acceptance)
