"""`bole calibrate --gpu GPU --model M`: how to speculate per (batch, KV bucket) - no
speculation, a chain or a tree, drafting counted - and the paper's budget B_ver (Eq. 12),
written as a profile.

Measures on the named GPU when it is the one present (through bole_cli.runtime); else
estimates with a roofline model of the same forward, labelled so in the file and on screen.
bole_cli.calibrate.pipeline does the work (docs/design.md §5, §8); this module parses the
options, shows the progress and renders the summary table.
"""

from __future__ import annotations

from pathlib import Path
from typing import ContextManager, Optional

import typer

from bole_cli.calibrate.acceptance import DEFAULT_PRESET, PRESET_TARGETS
from bole_cli.calibrate.defaults import (DEFAULT_BATCHES, DEFAULT_EPS, DEFAULT_GRID, DEFAULT_KV_LENS,
                                        DEFAULT_REPEATS, DEFAULT_WARMUP, MAX_BATCH, MAX_GRID_POINT,
                                        MAX_KV_LEN)
from bole_cli.calibrate.pipeline import int_list_text
from bole_cli.commands import DRAFT_VOCAB_HELP, float_option, int_option, path_value
from bole_cli.parsing import parse_int_list


def _progress(total: int) -> ContextManager:
    """A progress bar on stderr for the measured sweep; yields the per-step callback."""
    from bole_cli.console import progress_bar

    return progress_bar(total, "calibrating")


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def _table(profile: dict, title: str):
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from bole_cli.calibrate.summary import summary_rows
    from bole_cli.console import add_columns
    from bole_cli.profiles.schema import failed_cells

    rows = summary_rows(profile)
    failed = failed_cells(profile)
    acc = (profile.get("acceptance") or {}).get("name", "none")
    notes = [f"B_ver: largest N with T_ver(N) <= (1 + {profile['eps']:g}) T_dec (Eq. 12, the "
             "paper's rule); *: the decision is not a tree of B_ver tokens.",
             f"Decision: the most expected committed tokens per second (acceptance: {acc}), "
             "drafting, verify, commit and sampling counted; vs AR on the same terms. "
             "Runner-up: the best of another mode, and its tokens/s against the decision."]
    if any(r["below_threshold"] for r in rows):
        notes.append("!: no grid point met the threshold; B_ver is the smallest.")
    if any(r["decision"] is None for r in rows):
        notes.append("-: no decision (no drafter costs or acceptance model in the profile).")
    if failed:
        notes.append("failed: the cell's decode step failed (it does not fit the GPU's memory, "
                     "say); the profile's provenance.failures says why.")
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True, caption_justify="left",
              caption=escape(" ".join(notes)))
    add_columns(t, ("batch", "kv", "T_dec\nms", "B_ver", "decision", "tok\n/step", "step\nms", "vs AR",
                    "runner-up"), text=("decision", "runner-up"))
    failed_rows = [{"batch": b, "kv_len": kv, "failed": True} for b, kv, _why in failed]
    for r in sorted(rows + failed_rows, key=lambda r: (r["batch"], r["kv_len"])):
        if r.get("failed"):
            t.add_row(str(r["batch"]), str(r["kv_len"]), "-", "-", "[red]failed[/]", "-", "-", "-", "-")
            continue
        b_ver = (str(r["b_ver"]) + ("*" if r["differs"] else "")
                 + (" [yellow]![/]" if r["below_threshold"] else ""))
        cells = [str(r["batch"]), str(r["kv_len"]), _ms(r["t_dec"]), b_ver]
        if r["decision"] is not None:
            vs = max(r["runner_up_vs"] * 100, -99) if r["runner_up"] else 0.0
            runner = (f"{r['runner_up']} {vs:+.1f}%" if r["runner_up"] and vs > -10 else
                      f"{r['runner_up']} {vs:+.0f}%" if r["runner_up"] else "-")
            cells += [r["decision"], f"{r['tokens_per_step']:.1f}", _ms(r["step_s"]),
                      f"{r['speedup']:.2f}x", runner]
        else:
            cells += ["-", "-", "-", "-", "-"]
        t.add_row(*cells)
    return t


def calibrate(
    gpu: str = typer.Option(..., "--gpu", help="GPU key or name (bole hardware lists them)."),
    model: str = typer.Option(..., "--model",
                              help="Catalogue model (9b, Qwen/Qwen3.5-27B, ...) or a config.json."),
    batch: str = typer.Option(int_list_text(DEFAULT_BATCHES), "--batch", help="Batch sizes, comma-separated."),
    kv: str = typer.Option(int_list_text(DEFAULT_KV_LENS), "--kv", help="KV-length buckets, comma-separated."),
    grid: str = typer.Option(int_list_text(DEFAULT_GRID), "--grid", show_default=False,
                             help="Tree-token budgets N (whole batch) to time, comma-separated. "
                                  f"\\[default: {', '.join(map(str, DEFAULT_GRID))}]"),
    eps: float = float_option(DEFAULT_EPS, "--eps", help="Eq. 12 tolerance: T_ver <= (1+eps) T_dec."),
    out: Optional[Path] = typer.Option(
        None, "--out", parser=path_value, metavar="FILE",
        help="Profile to write. Default: <gpu>/<model>.yaml in the cache's profiles folder "
             "(the cache: $BOLE_CACHE_DIR, else $XDG_CACHE_HOME/bole, else ~/.cache/bole)."),
    measure_: bool = typer.Option(False, "--measure",
                                  help="Demand a measurement; error unless the named GPU is present."),
    estimate: bool = typer.Option(False, "--estimate",
                                  help="Use the roofline model even when the GPU is present."),
    acceptance: str = typer.Option(
        DEFAULT_PRESET, "--acceptance",
        help=f"Acceptance statistics for the decision: a preset ({', '.join(PRESET_TARGETS)}), "
             "or a YAML/JSON file: per-depth acceptance, `bole acceptance`'s measurement, or "
             "an accepted-length histogram a server reported."),
    draft_vocab: Optional[int] = int_option(None, "--draft-vocab", help=DRAFT_VOCAB_HELP),
    repeats: int = int_option(DEFAULT_REPEATS, "--repeats", help="Timed runs per point (measured path)."),
    warmup: int = int_option(DEFAULT_WARMUP, "--warmup", help="Untimed runs per point (measured path)."),
    layers_sample: Optional[int] = int_option(
        None, "--layers-sample", metavar="K",
        help="Measured path: time K blocks of four layers and scale to the full depth."),
    note: str = typer.Option("", "--note", help="Free text stored as provenance.note."),
    no_plot: bool = typer.Option(False, "--no-plot", help="Save no PNG next to the profile."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Decide how to speculate per batch size and KV length; write a profile and a plot."""
    import shlex

    from rich.markup import escape

    from bole_cli.calibrate.pipeline import plan_calibration, run_calibration
    from bole_cli.console import emit_json, err, out as console, shell_lines, shown_text

    plan = plan_calibration(
        gpu=gpu, model=model, batches=parse_int_list(batch, "--batch", maximum=MAX_BATCH),
        kvs=parse_int_list(kv, "--kv", maximum=MAX_KV_LEN),
        points=parse_int_list(grid, "--grid", maximum=MAX_GRID_POINT), eps=eps, out=out,
        measure=measure_, estimate=estimate, acceptance=acceptance, draft_vocab=draft_vocab, repeats=repeats,
        warmup=warmup, layers_sample=layers_sample, note=note, plot=not no_plot)
    if plan.measured and plan.detected.mismatch:
        err.print(f"[yellow]note:[/] {escape(plan.detected.mismatch)}")

    def announce(label: str) -> None:
        if not json_out:
            console.print(f"[bold {'green' if plan.measured else 'yellow'}]{escape(label)}[/]")

    result = run_calibration(plan, announce=announce, progress=_progress, plot=not no_plot)
    if json_out:
        emit_json({"path": str(result.path),
                   "plot": str(result.plot_path) if result.plot_path else None,
                   "label": result.label, "warnings": result.warnings, "profile": result.profile,
                   "served": result.served,
                   "serve_command": shlex.join(result.serve_command) if result.serve_command else None})
    else:
        title = f"{shown_text(plan.model_spec.name)} on {escape(plan.gpu_spec.name)}, bf16"
        if plan.draft_vocab:
            title += f", drafting over {plan.draft_vocab:,} hot tokens"
        console.print(_table(result.profile, title))
        measured = (result.profile.get("acceptance") or {}).get("measured") or {}
        if measured.get("verdict"):  # an observed histogram's fit: say how good it is
            console.print(f"acceptance: {escape(measured.get('what', ''))}: "
                          f"{escape(measured['verdict'])}", soft_wrap=False)
        for w in result.warnings:
            err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
        console.print(f"profile: {escape(str(result.path))}")
        if result.served:
            console.print(f"[yellow]note:[/] {escape(result.served)}", soft_wrap=False)
            for line in shell_lines(result.serve_command, width=console.width):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        if result.plot_path:
            console.print(f"plot:    {escape(str(result.plot_path))}")
    if result.interrupted:
        from bole_cli.interrupts import exit_code, reason

        partial = (result.profile.get("provenance") or {}).get("partial")
        err.print(f"[yellow]{reason()}:[/] {'partial ' if partial else ''}profile written to "
                  f"{escape(str(result.path))}", soft_wrap=True)
        raise typer.Exit(exit_code())


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
