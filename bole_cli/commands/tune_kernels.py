"""`bole tune-kernels`: search the best launch config of tree_verify, tree_commit and
tree_conv per shape bucket on this GPU, and store it where the kernels look it up.

One Optuna study per (kernel, model shape, batch, nodes) in SQLite under the user's cache
directory (an interrupted run resumes); each candidate is checked against the float64
reference before it is timed; the built-in config is timed in the same study and kept
whenever the search does not beat it. See bole_cli/tuning/ for the details.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from bole_cli.parsing import parse_int_list
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.errors import BoleError, InputError

DEFAULT_KERNELS = "tree_verify,tree_commit,tree_conv"


def _names(text: str, option: str) -> list[str]:
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names:
        raise InputError(f"{option}: expected a comma-separated list")
    return list(dict.fromkeys(names))


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _space_table(rows: list[dict]):
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    short = {"num_warps": "warps", "num_stages": "stages"}
    t = Table(title="search space per kernel and model shape", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("kernel", no_wrap=True)
    t.add_column("shape / models")
    t.add_column("values", no_wrap=True)
    t.add_column("configs", justify="right")
    t.add_column("built-in (first bucket)")
    for r in rows:
        values = "\n".join(f"{short.get(k, k)}: {'/'.join(map(str, v))}" for k, v in r["space"].items())
        models = ", ".join(m.split("/")[-1] for m in r["models"])
        t.add_row(r["kernel"], escape(f"{r['shape']}\n{models}"), values, str(r["size"]), r["default"])
    return t


def _check_table(rows: list[dict]):
    from rich import box
    from rich.table import Table

    from bole_cli.tuning.space import format_config

    t = Table(title="sampled candidates vs the float64 reference", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("kernel", "config", "result", "rel. err"):
        t.add_column(col, justify="right" if col == "rel. err" else "left")
    for r in rows:
        result = "[green]ok[/]" if r["ok"] else f"[red]{r['outcome']}[/]: {r['reason']}"
        err = f"{r['error']:.1e}" if r.get("error") is not None else "-"
        t.add_row(r["kernel"], format_config(r["config"]), result, err)
    return t


def _result_table(results, device: str, triton_version: str):
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from bole_cli.tuning.space import format_config

    t = Table(title=escape(f"tuned launch configs on {device} (triton {triton_version})"), title_justify="left",
              box=box.SIMPLE_HEAD, caption_justify="left",
              caption="us: median microseconds per launch (CUDA graph, rotating inputs). The built-in config "
                      "is kept unless the best beats it by 2% when re-timed side by side.")
    for col in ("kernel", "shape", "batch", "nodes", "best config", "us", "default us", "speedup", "trials"):
        t.add_column(col, justify="left" if col in ("kernel", "shape", "best config") else "right")
    for r in results:
        b = r.bucket
        if r.failed:
            t.add_row(b.kernel, b.model_key, str(b.batch), str(b.nodes or "-"), f"[red]{escape(r.failed)}[/]",
                      "-", "-", "-", "-")
            continue
        c = r.counts
        extra = [f"{c[k]} {k}" for k in ("slow", "rejected", "skipped") if c.get(k)]
        n = sum(c.get(k, 0) for k in ("timed", "slow", "rejected", "skipped"))
        trials = f"{n}" + (f" ({', '.join(extra)})" if extra else "") + (" [yellow]cut[/]" if r.cut_short else "")
        cfg = format_config(r.config) + (" [dim](built-in)[/]" if r.is_default else "")
        t.add_row(b.kernel, b.model_key, str(b.batch), str(b.nodes or "-"), cfg, f"{r.us:.1f}",
                  f"{r.default_us:.1f}", f"{r.speedup:.2f}x", trials)
    return t


def _dry_run(buckets, owners, kernels, sample: int, seed: int, trials: int, sampler: str,
             json_out: bool) -> None:
    from bole_cli.console import emit_json, out
    from bole_cli.tuning.space import format_config, sample_candidates, search_space, space_size
    from bole_cli.tuning.study import builtin_default, estimate_seconds

    spaces = []
    checks: list[tuple[str, dict]] = []
    seen_kernel = set()
    for (kernel, model), models in owners.items():
        first = next(b for b in buckets if b.kernel == kernel and b.model == model)
        default = builtin_default(first)
        space = search_space(kernel, first.dims, include=default)
        spaces.append({"kernel": kernel, "shape": first.model_key, "models": models, "space": space,
                       "size": space_size(space), "default": format_config(default),
                       "default_config": default})
        if kernel not in seen_kernel:  # a sample per kernel, from its first model shape
            seen_kernel.add(kernel)
            checks.extend((kernel, c) for c in sample_candidates(space, sample, seed, first=default))

    from bole_cli.kernels._env import interpreting
    from bole_cli.tuning.gpu import dry_run_checks

    device = "cpu" if interpreting() else "cuda"  # kernels compiled for a GPU need GPU tensors
    rows = dry_run_checks(checks, device=device, seed=seed)
    est = estimate_seconds(buckets, trials, sampler)
    failed = [r for r in rows if not r["ok"]]
    where = "Triton interpreter on the CPU" if device == "cpu" else "compiled, on the GPU"
    data = {"dry_run": True, "kernels": list(kernels), "spaces": [
        {k: v for k, v in s.items() if k != "default"} for s in spaces],
        "buckets": [b.key for b in buckets], "estimate_s": est, "trials": trials, "sampler": sampler,
        "validated": rows, "validated_on": where}
    if json_out:
        emit_json(data)
    else:
        out.print(_space_table(spaces))
        per_kernel = {k: sum(1 for b in buckets if b.kernel == k) for k in kernels}
        out.print(f"{len(buckets)} buckets (" + ", ".join(f"{k} {n}" for k, n in per_kernel.items())
                  + f") x {trials} trials: about {_minutes(est)} on a GPU (estimate)")
        out.print(_check_table(rows))
        out.print(f"dry run: {len(rows) - len(failed)} of {len(rows)} sampled candidates match the reference "
                  f"({where}, tiny shape; timing needs a CUDA GPU)")
    if failed:
        f = failed[0]
        raise BoleError(f"dry run: {len(failed)} of {len(rows)} sampled candidates failed, e.g. {f['kernel']} "
                        f"{format_config(f['config'])}: {f['outcome']}: {f['reason']}")


def tune_kernels(
    model: str = typer.Option("9b", "--model", "-m",
                              help="Model(s) whose GDN shapes to tune, comma-separated (e.g. 4b,9b,27b)."),
    nodes: str = typer.Option("16,64", "--nodes", help="Tree nodes per request, comma-separated."),
    batch: str = typer.Option("1,4,16,64", "--batch", help="Batch sizes, comma-separated."),
    trials: int = typer.Option(12, "--trials", help="Candidates evaluated per bucket (the default included)."),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe (Optuna's TPE) or grid (capped at --trials)."),
    kernels: str = typer.Option(DEFAULT_KERNELS, "--kernels", help="Kernels to tune, comma-separated."),
    profile: Optional[Path] = typer.Option(
        None, "--profile",
        help="Profile to write (default: $XDG_CACHE_HOME/bole/profiles/<gpu>/kernels.yaml)."),
    study_db: Optional[Path] = typer.Option(
        None, "--study-db", help="Optuna storage (default: $XDG_CACHE_HOME/bole/tune/studies.sqlite3)."),
    fresh: bool = typer.Option(False, "--fresh", help="Discard earlier studies of these buckets."),
    max_minutes: Optional[float] = typer.Option(
        None, "--max-minutes", help="Time budget; shared out over the buckets (each keeps its default)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the samplers and the random inputs."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Print the search space and check sampled candidates on a tiny shape (no GPU)."),
    sample: int = typer.Option(4, "--sample", help="Dry run: candidates checked per kernel."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write the JSON results to this file."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Tune the kernels' launch configs (tile widths, warps, stages) per shape bucket on this GPU."""
    from bole_cli.catalog.models import resolve_model
    from bole_cli.tuning.buckets import plan_buckets
    from bole_cli.tuning.space import KERNELS

    specs = [resolve_model(m) for m in _names(model, "--model")]
    kernel_list = _names(kernels, "--kernels")
    bad = [k for k in kernel_list if k not in KERNELS]
    if bad:
        raise InputError(f"--kernels: unknown {', '.join(bad)}; tunable: {', '.join(KERNELS)}")
    batches = parse_int_list(batch, "--batch")
    node_list = parse_int_list(nodes, "--nodes")
    if max(node_list) > MAX_TREE_NODES:
        raise InputError(f"--nodes: at most {MAX_TREE_NODES} nodes per request")
    if trials < 1:
        raise InputError(f"--trials: must be >= 1, got {trials}")
    if sampler not in ("tpe", "grid"):
        raise InputError(f"--sampler: expected tpe or grid, got {sampler!r}")
    if max_minutes is not None and not max_minutes > 0:
        raise InputError(f"--max-minutes: must be > 0, got {max_minutes:g}")
    if sample < 1:
        raise InputError(f"--sample: must be >= 1, got {sample}")
    buckets, owners = plan_buckets(specs, kernel_list, batches, node_list)

    if dry_run:
        if report is not None:
            raise InputError("--report: only a real tuning run writes a report; drop it with --dry-run")
        _dry_run(buckets, owners, kernel_list, sample, seed, trials, sampler, json_out)
        return

    import torch

    if not torch.cuda.is_available():
        raise BoleError("bole tune-kernels times the kernels and needs a CUDA GPU (none found); "
                        "`bole tune-kernels --dry-run` prints the search space and checks candidates on the CPU")
    _run(buckets, owners, trials=trials, sampler=sampler, profile=profile, study_db=study_db, fresh=fresh,
         max_minutes=max_minutes, seed=seed, json_out=json_out, report=report)


def _run(buckets, owners, *, trials, sampler, profile, study_db, fresh, max_minutes, seed, json_out,
         report=None) -> None:
    import torch
    import triton
    from rich.markup import escape
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from bole_cli.bench.kernel_bench import warm_gpu
    from bole_cli.console import atomic_write_text, dumps_json, emit_json, err, out
    from bole_cli.profiles.io import user_profiles_dir
    from bole_cli.tuning.gpu import GpuEvaluator
    from bole_cli.tuning.study import (TuneSettings, builtin_configs, default_storage_path, estimate_seconds,
                                       import_optuna, open_storage, run_tuning)
    from bole_cli.tuning.tables import (gpu_key_for, held_configs, kernels_profile_path,
                                        new_kernels_profile, record_entries, table_paths)

    optuna = import_optuna()
    device_name = torch.cuda.get_device_name()
    gpu_key = gpu_key_for(device_name)
    profile_path = Path(profile) if profile is not None else kernels_profile_path(user_profiles_dir(), gpu_key)
    storage, storage_path, storage_kind = open_storage(optuna, study_db or default_storage_path())
    settings = TuneSettings(trials=trials, sampler=sampler, seed=seed)
    est = estimate_seconds(buckets, trials, sampler)
    budget_s = max_minutes * 60 if max_minutes is not None else None
    note = f"; budget {_minutes(budget_s)}" if budget_s is not None else ""
    err.print(escape(f"tuning {len(buckets)} buckets x {trials} trials ({sampler}) on {device_name}: "
                     f"about {_minutes(est)} (estimate{note})"), soft_wrap=True)
    err.print(escape(f"studies: {storage_path} ({storage_kind}); results: {profile_path}"), soft_wrap=True)
    create = new_kernels_profile(gpu_key, device_name, torch_version=str(torch.__version__),
                                 triton_version=triton.__version__,
                                 command=" ".join(["bole"] + sys.argv[1:]))
    saved: list = []
    # the entries in force now (the table written to first, then the lookup's order)
    incumbents = held_configs([profile_path, *table_paths(device_name)], device_name, triton.__version__)

    def on_result(res):
        if not res.failed:
            record_entries(profile_path, device_name, triton.__version__, {res.bucket.key: res.to_entry()},
                           create=create)
            saved.append(res.bucket.key)

    started = time.time()
    evaluator = GpuEvaluator(seed=seed)
    warm_gpu(torch)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=err, transient=True)
    try:
        with builtin_configs(), progress:
            task = progress.add_task("tuning", total=len(buckets) * trials)
            done = {"buckets": 0}

            def on_trial(bucket, info):
                progress.update(task, description=escape(f"{bucket.describe()} ({info.get('outcome')})"),
                                advance=1 if info.get("counted") else 0)

            def on_bucket(res):
                done["buckets"] += 1
                progress.update(task, completed=done["buckets"] * trials)
                on_result(res)

            results = run_tuning(optuna, storage, buckets, evaluator, settings, owners=owners, fresh=fresh,
                                 budget_s=budget_s, on_trial=on_trial, on_result=on_bucket,
                                 incumbents=incumbents)
    except KeyboardInterrupt:
        err.print(escape(f"interrupted: {len(saved)} of {len(buckets)} buckets saved to {profile_path}; "
                         "run the same command again to resume"), soft_wrap=True)
        raise
    seconds = time.time() - started
    data = {
        "device": device_name, "gpu": gpu_key, "triton": triton.__version__, "torch": str(torch.__version__),
        "profile": str(profile_path), "storage": str(storage_path), "storage_kind": storage_kind,
        "estimate_s": est, "seconds": seconds,
        "settings": {"trials": trials, "sampler": sampler, "seed": seed, "quick_ms": settings.quick_ms,
                     "full_ms": settings.full_ms, "slow_ratio": settings.slow_ratio, "margin": settings.margin},
        "results": [r.to_dict() for r in results],
    }
    if report is not None:
        atomic_write_text(report, dumps_json(data) + "\n")
    if json_out:
        emit_json(data)
    else:
        out.print(_result_table(results, device_name, triton.__version__))
        out.print(escape(f"{len(saved)} buckets written to {profile_path} in {_minutes(seconds)}"))
    failed = [r for r in results if r.failed]
    if failed:
        raise BoleError(f"{len(failed)} bucket(s) kept no config: {failed[0].bucket.key}: {failed[0].failed}")


def register(app: typer.Typer) -> None:
    app.command("tune-kernels")(tune_kernels)
