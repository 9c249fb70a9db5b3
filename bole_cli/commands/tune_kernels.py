"""`bole tune-kernels`: search the best launch config of the served kernels (tree_verify,
tree_commit_replay, tree_conv; tree_commit on request) per shape bucket on this GPU, and store
it where the kernels look it up.

One Optuna study per (kernel, model shape, batch, nodes) in SQLite under the user's cache
directory (an interrupted run resumes); each candidate is checked against the float64
reference before it is timed; the built-in config is timed in the same study and kept
whenever the search does not beat it. The work is bole_cli.tuning.run's (docs/design.md §5);
this module parses the options and renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bole_cli.commands import float_option, int_option, path_value
from bole_cli.errors import BoleError, InputError
from bole_cli.limits import MAX_BATCH_REQUESTS, MAX_SEED, MAX_TREE_NODES
from bole_cli.parsing import check_int, parse_int_list, parse_name_list

DEFAULT_KERNELS = "tree_verify,tree_commit_replay,tree_conv"  # the served kernels (tree_commit: opt-in)
DRY_RUN_SAMPLE = 4  # candidates a dry run checks per kernel
#: The most --sample takes: a dry run is a smoke test in the Triton interpreter, about 0.5 s a
#: candidate on a CPU (tree_verify), so 16 a kernel stays well under a minute for all four;
#: a real run checks every candidate it times.
MAX_DRY_RUN_SAMPLE = 16
#: The most --trials takes, per bucket: past every kernel's whole space (hundreds of
#: configs), low enough that a typo fails at once.
MAX_TRIALS = 1000


def _render_dry_run(dry, json_out: bool) -> None:
    from bole_cli.console import emit_json, out
    from bole_cli.tuning.report import check_table, minutes, space_table
    from bole_cli.tuning.space import format_config

    rows, failed = dry.rows, dry.failed
    if json_out:
        emit_json(dry.to_dict())
    else:
        out.print(space_table(dry.spaces))
        out.print(f"{len(dry.buckets)} buckets (" + ", ".join(f"{k} {n}" for k, n in dry.buckets_per_kernel().items())
                  + f") x {dry.trials} trials: about {minutes(dry.estimate_s)} on a GPU (estimate)")
        out.print(check_table(rows))
        out.print(f"dry run: {len(rows) - len(failed)} of {len(rows)} sampled candidates match the reference "
                  f"({dry.where}, tiny shape; timing needs a CUDA GPU)")
    if failed:
        f = failed[0]
        raise BoleError(f"dry run: {len(failed)} of {len(rows)} sampled candidates failed, e.g. {f['kernel']} "
                        f"{format_config(f['config'])}: {f['outcome']}: {f['reason']}")


def tune_kernels(
    model: str = typer.Option("9b", "--model", "-m",
                              help="Model(s) whose GDN shapes to tune, comma-separated (e.g. 4b,9b,27b)."),
    nodes: str = typer.Option("16,64,128,192,256", "--nodes", help="Tree nodes per request, comma-separated."),
    batch: str = typer.Option("1,4,16,64", "--batch", help="Batch sizes, comma-separated."),
    trials: int = int_option(12, "--trials", help="Candidates evaluated per bucket (the default included)."),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe (Optuna's TPE) or grid (capped at --trials)."),
    kernels: str = typer.Option(DEFAULT_KERNELS, "--kernels", help="Kernels to tune, comma-separated."),
    profile: Optional[Path] = typer.Option(
        None, "--profile", parser=path_value, metavar="FILE",
        help="Profile to write. Default: <gpu>/kernels.yaml in the cache's profiles folder "
             "(the cache: $BOLE_CACHE_DIR, else $XDG_CACHE_HOME/bole, else ~/.cache/bole)."),
    study_db: Optional[Path] = typer.Option(
        None, "--study-db", parser=path_value, metavar="FILE", help="Optuna storage. Default: tune/studies.sqlite3 in the cache."),
    fresh: bool = typer.Option(False, "--fresh", help="Discard earlier studies of these buckets."),
    max_minutes: Optional[float] = float_option(
        None, "--max-minutes", help="Time budget; shared out over the buckets (each keeps its default)."),
    seed: int = int_option(0, "--seed", help="Seed of the samplers and the random inputs."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Print the search space and check sampled candidates on a tiny shape (no GPU)."),
    sample: Optional[int] = int_option(None, "--sample",
                                       help=f"Dry run: candidates checked per kernel, at most {MAX_DRY_RUN_SAMPLE} "
                                            "(each takes about 0.5 s in the Triton interpreter) "
                                            f"\\[{DRY_RUN_SAMPLE}]."),
    report: Optional[Path] = typer.Option(None, "--report", parser=path_value, metavar="FILE", help="Also write the JSON results to this file."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Tune the kernels' launch configs (tile widths, warps, stages) per shape bucket on this GPU."""
    from bole_cli.catalog.models import resolve_model
    from bole_cli.tuning.space import KERNELS

    specs = [resolve_model(m) for m in parse_name_list(model, "--model")]
    kernel_list = parse_name_list(kernels, "--kernels")
    bad = [k for k in kernel_list if k not in KERNELS]
    if bad:
        raise InputError(f"--kernels: unknown {', '.join(bad)}; tunable: {', '.join(KERNELS)}")
    batches = parse_int_list(batch, "--batch", maximum=MAX_BATCH_REQUESTS)
    node_list = parse_int_list(nodes, "--nodes", maximum=MAX_TREE_NODES)
    check_int(trials, "--trials", maximum=MAX_TRIALS)
    check_int(seed, "--seed", minimum=0, maximum=MAX_SEED)
    if sampler not in ("tpe", "grid"):
        raise InputError(f"--sampler: expected tpe or grid, got {sampler!r}")
    if max_minutes is not None and max_minutes <= 0:  # finite: float_option's reader
        raise InputError(f"--max-minutes: must be a number of minutes above 0, got {max_minutes:g}; "
                         "leave it out for no limit")
    check_int(sample, "--sample", maximum=MAX_DRY_RUN_SAMPLE)
    if not dry_run:
        from bole_cli.console import check_writable

        if sample is not None:
            raise InputError("--sample: only a dry run checks sampled candidates; add --dry-run or drop it")
        for flag, path in (("--profile", profile), ("--report", report), ("--study-db", study_db)):
            if path is not None:
                check_writable(path, flag)
        if profile is not None:
            from bole_cli.tuning.tables import check_kernels_profile

            check_kernels_profile(profile, "--profile")
    if dry_run:
        for flag, given in (("--report", report is not None), ("--profile", profile is not None),
                            ("--study-db", study_db is not None), ("--fresh", fresh),
                            ("--max-minutes", max_minutes is not None)):
            if given:
                raise InputError(f"{flag}: only a real tuning run uses it; drop it with --dry-run")
        from bole_cli.tuning.run import dry_run as run_dry

        _render_dry_run(run_dry(specs, kernel_list, batches, node_list, sample=sample or DRY_RUN_SAMPLE, seed=seed,
                                trials=trials, sampler=sampler), json_out)
        return
    _tune(specs, kernel_list, batches, node_list, dict(trials=trials, sampler=sampler, seed=seed, profile=profile,
                                                        study_db=study_db, fresh=fresh, max_minutes=max_minutes),
          json_out, report)


def _tune(specs, kernels, batches, nodes, settings: dict, json_out: bool, report: Optional[Path]) -> None:
    from rich.markup import escape
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from bole_cli.console import atomic_write_text, dumps_json, emit_json, err, out
    from bole_cli.tuning.report import minutes, result_table
    from bole_cli.tuning.run import tune

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)
    trials = settings["trials"]
    state: dict = {"buckets": 0}

    def on_start(run):
        state["run"] = run
        note = f"; budget {minutes(run.budget_s)}" if run.budget_s is not None else ""
        err.print(escape(f"tuning {len(run.buckets)} buckets x {trials} trials ({settings['sampler']}) on "
                         f"{run.device_name}: about {minutes(run.estimate_s)} (estimate{note})"), soft_wrap=True)
        err.print(escape(f"studies: {run.storage_path} ({run.storage_kind}); results: {run.profile_path}"),
                  soft_wrap=True)
        state["task"] = progress.add_task("tuning", total=len(run.buckets) * trials)
        progress.start()

    def on_trial(bucket, info):
        progress.update(state["task"], description=escape(f"{bucket.describe()} ({info.get('outcome')})"),
                        advance=1 if info.get("counted") else 0)

    def on_bucket(res):
        state["buckets"] += 1
        progress.update(state["task"], completed=state["buckets"] * trials)

    def stop():
        if state.pop("task", None) is not None:  # started, once: a never-started Progress
            progress.stop()                      # prints a stray newline on stop

    try:
        run = tune(specs, kernels, batches, nodes, **settings, on_start=on_start, on_trial=on_trial,
                   on_bucket=on_bucket)
    except KeyboardInterrupt:
        stop()
        run = state.get("run")
        if run is not None:
            err.print(escape(f"interrupted: {len(run.saved)} of {len(run.buckets)} buckets saved to "
                             f"{run.profile_path}; run the same command again to resume"), soft_wrap=True)
        raise
    finally:
        stop()
    data = run.to_dict()
    if report is not None:
        atomic_write_text(report, dumps_json(data) + "\n")
    if json_out:
        emit_json(data)
    else:
        out.print(result_table(run.results, run.device_name, run.triton_version))
        out.print(escape(f"{len(run.saved)} buckets written to {run.profile_path} in {minutes(run.seconds)}"))
    failed = run.failed
    if failed:
        raise BoleError(f"{len(failed)} bucket(s) kept no config: {failed[0].bucket.key}: {failed[0].failed}")


def register(app: typer.Typer) -> None:
    app.command("tune-kernels")(tune_kernels)
