"""The tables of `bole tune-kernels` (bole_cli.tuning.run's DryRun and TuneRun, rendered
with Rich; docs/design.md §5). Rich is imported inside the functions.
"""

from __future__ import annotations

from bole_cli.tuning.space import format_config


def minutes(seconds: float) -> str:
    """'45 s' below 90 seconds, else '2.5 min'."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def space_table(rows: list[dict]):
    """The dry run's search space per kernel and model shape (DryRun.spaces)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    short = {"num_warps": "warps", "num_stages": "stages"}
    t = Table(title="search space per kernel and model shape", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("kernel", no_wrap=True)
    # a bucket's name is one word (copied into tables and commands): never split, the
    # models one a line below it; the built-in config wraps between its settings instead
    t.add_column("shape / models", no_wrap=True)
    t.add_column("values (configs)", no_wrap=True)
    t.add_column("built-in (first bucket)")
    for r in rows:
        values = "\n".join([f"{short.get(k, k)}: {'/'.join(map(str, v))}" for k, v in r["space"].items()]
                           + [f"({r['size']} configs)"])
        models = "\n".join(m.split("/")[-1] for m in r["models"])
        t.add_row(r["kernel"], escape(f"{r['shape']}\n{models}"), values, r["default"])
    return t


def check_table(rows: list[dict]):
    """The dry run's sampled candidates and their verdicts (DryRun.rows)."""
    from rich import box
    from rich.table import Table

    t = Table(title="sampled candidates vs the float64 reference", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("kernel", "config", "result", "rel. err"):
        t.add_column(col, justify="right" if col == "rel. err" else "left", overflow="fold")
    for r in rows:
        result = "[green]ok[/]" if r["ok"] else f"[red]{r['outcome']}[/]: {r['reason']}"
        err = f"{r['error']:.1e}" if r.get("error") is not None else "-"
        t.add_row(r["kernel"], format_config(r["config"]), result, err)
    return t


def result_table(results, device: str, triton_version: str):
    """A tuning run's best config per bucket (TuneRun.results) against the built-in one."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"tuned launch configs on {device} (triton {triton_version})"), title_justify="left",
              box=box.SIMPLE_HEAD, caption_justify="left",
              caption="us: median microseconds per launch (CUDA graph, rotating inputs). The built-in config "
                      "is kept unless the best beats it by 2% when re-timed side by side.")
    for col in ("kernel", "shape", "batch", "nodes", "best config", "us", "default us", "speedup", "trials"):
        t.add_column(col, justify="left" if col in ("kernel", "shape", "best config") else "right",
                     overflow="fold")
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
