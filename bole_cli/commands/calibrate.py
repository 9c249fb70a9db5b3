"""`bole calibrate --gpu GPU --model M`: the verify budget B_ver (Eq. 12) and the
throughput-optimal budget N* per (batch, KV bucket), written as a profile.

Measures on the named GPU when it is the one present (through bole_cli.runtime); else
estimates with a roofline model of the same forward, labelled so in the file and on screen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from bole_cli.calibrate.acceptance import DEFAULT_PRESET, PRESET_TARGETS
from bole_cli.calibrate.defaults import DEFAULT_BATCHES, DEFAULT_EPS, DEFAULT_GRID, DEFAULT_KV_LENS
from bole_cli.parsing import parse_int_list
from bole_cli.errors import BoleError, InputError


def _csv(values) -> str:
    return ",".join(map(str, values))


def _plot_path(path: Path) -> Path:
    """profile.yaml -> profile.png beside it (a dotted model name keeps its dots)."""
    stem = path.name
    for suffix in (".yaml", ".yml"):
        stem = stem.removesuffix(suffix)
    return path.with_name(stem + ".png")


def _check_out(path: Path, gpu_key: str, model_name: str) -> None:
    """Refuse an --out that cannot take this profile before a sweep is spent on it."""
    if path.is_dir():
        raise InputError(f"--out: {path} is a directory; give a .yaml file path")
    if path.suffix.lower() == ".png":
        raise InputError(f"--out: {path} is the plot's name; give a .yaml file path")
    if path.exists():
        from bole_cli.profiles import load_profile

        old = load_profile(path)
        if (old.get("gpu"), old.get("model")) != (gpu_key, model_name):
            raise InputError(f"--out: {path} holds {old.get('model')} on {old.get('gpu')}, "
                             f"not {model_name} on {gpu_key}")


def _runtime_forward(model: Any, detected: Any, layers_sample: Optional[int]) -> Any:
    """The runtime's Forward on the present device; BoleError when it is unavailable."""
    try:
        import torch

        from bole_cli.runtime.timer import HybridForwardTimer
    except ImportError as exc:
        raise BoleError(
            f"measuring needs bole_cli.runtime (the embedded Qwen3.5 forward), which cannot "
            f"be imported ({exc}); use --estimate for the roofline model") from None
    return HybridForwardTimer(model, f"cuda:{detected.index}", torch.bfloat16,
                              layers_sample=layers_sample)


def _device_for(gpu_spec: Any, measure: bool, estimate: bool) -> tuple[Any, str]:
    """(the detected device to measure on, or None; why the estimate was chosen)."""
    if estimate:
        return None, "--estimate"
    from bole_cli.catalog.hardware import detect_gpu

    detected = detect_gpu()
    if detected is not None and detected.spec is not None and detected.spec.key == gpu_spec.key:
        return detected, ""
    reason = (f"no {gpu_spec.key.upper()} present; "
              + (f"found {detected.name}" if detected else "no CUDA device"))
    if measure:
        raise BoleError(f"--measure: {reason}")
    return None, reason


def _run_with_progress(forward: Any, batches, kvs, points, timing: Any, *, show: bool) -> Any:
    """The sweep, with a progress bar on stderr when it takes a while (measuring)."""
    from bole_cli.calibrate.sweep import run_sweep, sweep_steps

    if not show:
        return run_sweep(forward, batches, kvs, points, timing)
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from bole_cli.console import err

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err,
                  transient=True) as progress:
        task = progress.add_task("calibrating", total=sweep_steps(batches, kvs, points))
        return run_sweep(forward, batches, kvs, points, timing,
                         on_step=lambda d: progress.update(task, advance=1, description=d))


def _command_line(gpu: str, model: str, batches, kvs, grid, eps: float, acceptance: str,
                  mode: str) -> str:
    parts = ["bole calibrate", f"--gpu {gpu}", f"--model {model}"]
    if tuple(batches) != DEFAULT_BATCHES:
        parts.append(f"--batch {_csv(batches)}")
    if tuple(kvs) != DEFAULT_KV_LENS:
        parts.append(f"--kv {_csv(kvs)}")
    if tuple(grid) != DEFAULT_GRID:
        parts.append(f"--grid {_csv(grid)}")
    if eps != DEFAULT_EPS:
        parts.append(f"--eps {eps:g}")
    if acceptance != DEFAULT_PRESET:
        parts.append(f"--acceptance {acceptance}")
    if mode:
        parts.append(mode)
    return " ".join(parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.1 else f"{seconds * 1e3:.1f}"


def _table(profile: dict, title: str):
    from rich import box
    from rich.table import Table

    from rich.markup import escape

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
              caption_justify="left",
              caption=escape(f"B_ver: largest N with T_ver(N) <= (1 + {profile['eps']:g}) T_dec (Eq. 12). "
                       "N*: argmax E[committed tokens | N] / T_ver(N) "
                       f"(acceptance: {(profile.get('acceptance') or {}).get('name', 'none')}). "
                       "N counts the tree tokens of the whole batch. vs AR: expected "
                       "tokens per second at N* over plain decoding."
                       + (" !: no grid point met the threshold; B_ver is the smallest."
                          if any(c.get("below_threshold") for c in profile["configs"]) else "")))
    for name, justify in (("batch", "right"), ("kv", "right"), ("T_dec\nms", "right"),
                          ("B_ver", "right"), ("T_ver@B_ver\nms", "right"), ("N*", "right"),
                          ("T_ver@N*\nms", "right"), ("tokens\n/step", "right"),
                          ("vs AR", "right")):
        t.add_column(name, justify=justify, no_wrap=True)
    for cfg in sorted(profile["configs"], key=lambda c: (c["batch"], c["kv_len"])):
        i = cfg["n"].index(cfg["b_ver"])
        b_ver = str(cfg["b_ver"]) + (" [yellow]![/]" if cfg.get("below_threshold") else "")
        row = [str(cfg["batch"]), str(cfg["kv_len"]), _ms(cfg["t_dec"]), b_ver,
               _ms(cfg["t_ver"][i])]
        if cfg.get("n_star") is not None:
            j = cfg["n"].index(cfg["n_star"])
            e = cfg["e_acc"][j]
            gain = (e / cfg["t_ver"][j]) / (cfg["batch"] / cfg["t_dec"])
            row += [str(cfg["n_star"]), _ms(cfg["t_ver"][j]), f"{e:.1f}", f"{gain:.2f}x"]
        else:
            row += ["-", "-", "-", "-"]
        t.add_row(*row)
    return t


def calibrate(
    gpu: str = typer.Option(..., "--gpu", help="GPU key or name (bole hardware lists them)."),
    model: str = typer.Option(..., "--model",
                              help="Catalogue model (9b, Qwen/Qwen3.5-27B, ...) or a config.json."),
    batch: str = typer.Option(_csv(DEFAULT_BATCHES), "--batch", help="Batch sizes, comma-separated."),
    kv: str = typer.Option(_csv(DEFAULT_KV_LENS), "--kv", help="KV-length buckets, comma-separated."),
    grid: str = typer.Option(_csv(DEFAULT_GRID), "--grid",
                             help="Tree-token budgets N (whole batch) to time, comma-separated."),
    eps: float = typer.Option(DEFAULT_EPS, "--eps", help="Eq. 12 tolerance: T_ver <= (1+eps) T_dec."),
    out: Optional[Path] = typer.Option(
        None, "--out",
        help="Profile to write (default: $XDG_CACHE_HOME/bole/profiles/<gpu>/<model>.yaml)."),
    measure_: bool = typer.Option(False, "--measure",
                                  help="Demand a measurement; error unless the named GPU is present."),
    estimate: bool = typer.Option(False, "--estimate",
                                  help="Use the roofline model even when the GPU is present."),
    acceptance: str = typer.Option(
        DEFAULT_PRESET, "--acceptance",
        help=f"Acceptance statistics for N*: a preset ({', '.join(PRESET_TARGETS)}) or a YAML/JSON file."),
    repeats: int = typer.Option(10, "--repeats", help="Timed runs per point (measured path)."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed runs per point (measured path)."),
    layers_sample: Optional[int] = typer.Option(
        None, "--layers-sample", metavar="K",
        help="Measured path: time K blocks of four layers and scale to the full depth."),
    note: str = typer.Option("", "--note", help="Free text stored as provenance.note."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Save a PNG next to the profile."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Pick the verify budget per batch size and KV length; write a profile and a plot."""
    from rich.markup import escape

    from bole_cli.calibrate.acceptance import load_acceptance
    from bole_cli.calibrate.costmodel import RooflineForward
    from bole_cli.calibrate.sweep import EXACT, Timing, build_profile, write_profile
    from bole_cli.catalog.hardware import resolve_gpu
    from bole_cli.catalog.models import resolve_model
    from bole_cli.console import emit_json, err, out as console
    from bole_cli.profiles.io import profile_path, user_profiles_dir

    batches = parse_int_list(batch, "--batch")
    kvs = parse_int_list(kv, "--kv")
    points = parse_int_list(grid, "--grid")
    if not eps > 0:
        raise InputError(f"--eps: must be > 0, got {eps:g}")
    if measure_ and estimate:
        raise InputError("--measure and --estimate exclude each other")
    if repeats < 1 or warmup < 0:
        raise InputError("--repeats must be >= 1 and --warmup >= 0")
    if layers_sample is not None and layers_sample < 1:
        raise InputError(f"--layers-sample: must be >= 1, got {layers_sample}")
    gpu_spec = resolve_gpu(gpu)
    model_spec = resolve_model(model)
    acc = load_acceptance(acceptance)
    unreachable = [b for b in batches if b > max(points)]
    if unreachable:
        raise InputError(f"--grid: no point reaches batch {unreachable[0]} (largest N is {max(points)}); "
                         "N counts tree tokens of the whole batch, at least one per request")
    path = Path(out) if out is not None else profile_path(user_profiles_dir(), gpu_spec.key, model_spec.name)
    _check_out(path, gpu_spec.key, model_spec.name)

    detected, reason = _device_for(gpu_spec, measure_, estimate)
    measured = detected is not None
    if measured:
        if detected.mismatch:
            err.print(f"[yellow]note:[/] {escape(detected.mismatch)}")
        forward = _runtime_forward(model_spec, detected, layers_sample)
        timing = Timing(warmup=warmup, repeats=repeats)
        label = f"MEASURED on {detected.name}"
    else:
        forward = RooflineForward(model_spec, gpu_spec)
        timing = EXACT
        label = f"ESTIMATED (roofline model, {reason})"
    if not json_out:
        console.print(f"[bold {'green' if measured else 'yellow'}]{escape(label)}[/]")
    sweep = _run_with_progress(forward, batches, kvs, points, timing, show=measured)

    if not sweep.curves:
        why = sweep.failures[0] if sweep.failures else "interrupted"
        raise BoleError(f"no configuration was measured ({why}); nothing written")
    extra: dict[str, Any] = {}
    if measured:
        extra["timing"] = timing.to_dict()
    info = getattr(forward, "info", None)
    if callable(info):
        details = dict(info())
        if "sampled_layers" in details:
            extra["sampled_layers"] = details.pop("sampled_layers")
        extra["cost_model" if not measured else "runtime"] = details
    profile, warnings = build_profile(
        gpu_key=gpu_spec.key, model_name=model_spec.name,
        kind="measured" if measured else "estimated", sweep=sweep, grid=points, eps=eps,
        acceptance=acc,
        device_name=getattr(forward, "device_name", None) or (detected.name if detected else gpu_spec.name),
        command=_command_line(gpu, model, batches, kvs, points, eps, acceptance,
                              "--measure" if measure_ else "--estimate" if estimate else ""),
        note="; ".join(x for x in ((label if not measured else ""), note) if x),
        extra_provenance=extra)

    profile = write_profile(path, profile)  # as written: with the file's kernels section
    plot_path = None
    if plot:
        from bole_cli.calibrate.plot import plot_profile

        plot_path = plot_profile(profile, _plot_path(path))

    if json_out:
        emit_json({"path": str(path), "plot": str(plot_path) if plot_path else None,
                   "label": label, "warnings": warnings, "profile": profile})
    else:
        title = f"{model_spec.name} on {gpu_spec.name}, bf16"
        console.print(_table(profile, escape(title)))
        for w in warnings:
            err.print(f"[yellow]warning:[/] {escape(w)}")
        console.print(f"profile: {escape(str(path))}")
        if plot_path:
            console.print(f"plot:    {escape(str(plot_path))}")
    if sweep.interrupted:
        err.print(f"[yellow]interrupted:[/] partial profile written to {escape(str(path))}")
        raise typer.Exit(130)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
