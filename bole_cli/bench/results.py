"""Where a `bole bench` run's results go: STEM.json and STEM.png under --out-dir.

Light (no torch, no matplotlib at import): commands/bench.py imports it on the `--help`
path. The default stem says what ran, where and on which model: kernels-h200-qwen3.5-9b.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from bole_cli.errors import InputError


def check_tag(tag: Optional[str]) -> Optional[str]:
    """--tag as given when it is a plain name (never a path out of --out-dir); commands
    call this before any work, so a bad tag costs no benchmark."""
    if tag is not None and (not tag or "/" in tag or "\\" in tag or tag in (".", "..")):
        raise InputError(f"--tag: {tag!r} must be a plain file name stem (no path)")
    return tag


def result_stem(tag: Optional[str], kind: str, device: str, model: str) -> str:
    """--tag (checked by `check_tag`), else KIND-GPU-MODEL."""
    if tag is None:
        gpu = device.replace("NVIDIA ", "").replace(" ", "-").lower()
        return f"{kind}-{gpu}-{model.split('/')[-1].lower()}"
    return check_tag(tag)


def write_results(data: dict, plot: Callable[[Path], None], out_dir: Path, stem: str) -> Path:
    """STEM.json (atomic) and STEM.png (plot(path)) under out_dir; returns the JSON path."""
    from bole_cli.console import atomic_write_text, dumps_json

    json_path = atomic_write_text(out_dir / f"{stem}.json", dumps_json(data) + "\n")
    plot(out_dir / f"{stem}.png")
    return json_path
