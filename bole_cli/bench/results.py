"""Where a `bole bench` run's results go: STEM.json and STEM.png under --out-dir, by
default the user's cache (bole_cli/paths.py `results_dir`), never the working directory.

Light (no torch, no matplotlib at import): commands/bench.py imports it on the `--help`
path. The default stem says what ran, where and on which model: kernels-h200-qwen3.5-9b.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from bole_cli.errors import BoleError, InputError, brief

#: The longest ending a result file gets (a cut run's, paths.PARTIAL); a --tag leaves room
#: for it in a file name.
_SUFFIX = "-partial.json"


def check_tag(tag: Optional[str]) -> Optional[str]:
    """--tag as given when it is a plain name (never a path out of --out-dir) that fits a
    file name with its suffix; commands call this before any work, so a bad tag costs no
    benchmark."""
    if tag is not None and (not tag or "/" in tag or "\\" in tag or tag in (".", "..")):
        raise InputError(f"--tag: {brief(tag)} must be a plain file name stem (no path)")
    if tag is not None and tag.lower().endswith((".json", ".png")):
        raise InputError(f"--tag: {brief(tag)} is a file name; give its stem (the command adds .json "
                         "and .png)")
    return tag


def check_outputs(out_dir: Optional[Path], tag: Optional[str]) -> Path:
    """The folder the results go to (--out-dir, else the cache's results/), checked with
    the tag's file names before any work: InputError names --tag or --out-dir."""
    from bole_cli.console import check_name_lengths, check_writable
    from bole_cli.paths import default_named, results_dir

    check_tag(tag)
    folder = results_dir() if out_dir is None else Path(out_dir)
    if tag is not None:
        check_name_lengths(Path(tag + _SUFFIX), "--tag")
    check_writable(folder / f"{tag or 'results'}{_SUFFIX}", "--out-dir" if out_dir is not None else
                   default_named("results folder"))
    return folder


def check_stem_free(out_dir: Path, tag: Optional[str], kind: str, device: str, model: str) -> None:
    """Once the stem is known (result_stem: the device names it) and before any timing:
    refuse a stem whose JSON or plot would replace one of the repository's records
    (--out-dir inside its experiments/: a record is never re-written by a run, the new run
    takes a new --tag)."""
    from bole_cli.console import check_not_a_record

    stem = result_stem(tag, kind, device, model)
    for suffix in (".json", ".png"):
        check_not_a_record(out_dir / f"{stem}{suffix}", "--tag" if tag else "--out-dir")


def result_stem(tag: Optional[str], kind: str, device: str, model: str, *, incomplete: str = "") -> str:
    """--tag (checked by `check_tag`), else KIND-GPU-MODEL; with `incomplete` (an interrupted
    run's 'partial', a run with nothing measured 'failed') that word after a dash, so such a
    run never replaces the complete results of an earlier one."""
    if tag is None:
        gpu = device.replace("NVIDIA ", "").replace(" ", "-").lower()
        stem = f"{kind}-{gpu}-{model.split('/')[-1].lower()}"
    else:
        stem = check_tag(tag)
    return f"{stem}-{incomplete}" if incomplete else stem  # incomplete: paths.PARTIAL or "failed"


def write_results(data: dict, plot: Optional[Callable[[Path], None]], out_dir: Path, stem: str) -> Path:
    """STEM.json (atomic) and STEM.png (plot(path); none when plot is None: nothing to draw)
    under out_dir; returns the JSON path.

    Both are written with Ctrl-C and SIGTERM held (bole_cli/interrupts.py), so a signal
    never leaves one without the other; the JSON (the measurements) goes first, and a plot
    that fails after it (a full disk) is a BoleError that says the JSON was kept."""
    from bole_cli.console import atomic_write_text, dumps_json
    from bole_cli.interrupts import held

    with held():
        json_path = atomic_write_text(out_dir / f"{stem}.json", dumps_json(data) + "\n")
        png_path = out_dir / f"{stem}.png"
        if plot is None:
            return json_path
        try:
            plot(png_path)
        except (OSError, BoleError) as exc:
            raise BoleError(f"wrote {json_path}, but not its plot {png_path.name}: "
                            f"{exc}") from None
    return json_path
