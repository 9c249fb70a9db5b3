"""Where Bole keeps its per-user files: profiles, tuning studies, locks, unpacked wheels,
bench results, measured acceptance."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from bole_cli import env


def cache_dir() -> Path:
    """$BOLE_CACHE_DIR, else $XDG_CACHE_HOME/bole, else ~/.cache/bole."""
    env_dir = os.environ.get(env.CACHE_DIR)
    if env_dir:
        return Path(env_dir).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "bole"


def default_named(what: str) -> str:
    """How an error names a default output under cache_dir() that the user gave no option
    for: `what`, the cache it lives in, and the variable that moves it."""
    return f"the default {what} (under {cache_dir()}; ${env.CACHE_DIR} moves it)"


def acceptance_dir() -> Path:
    """Where `bole acceptance` writes a measured acceptance file unless --out says
    otherwise: the cache, never the working directory (as results_dir)."""
    return cache_dir() / "acceptance"


def results_dir() -> Path:
    """Where `bole bench` writes a user's results unless --out-dir says otherwise: the
    cache, never the working directory (in a checkout that would overwrite the
    repository's own records in experiments/results/)."""
    return cache_dir() / "results"


def shipped_profiles_dir() -> Path:
    """The shipped profiles: the repository's profiles/ in a checkout or editable install,
    else where the wheel puts them (<sys.prefix>/share/bole/profiles)."""
    repo = Path(__file__).resolve().parents[1] / "profiles"
    if repo.is_dir():
        return repo
    return Path(sys.prefix) / "share" / "bole" / "profiles"


def repository_experiments() -> Optional[Path]:
    """In a checkout (an editable install), the repository's experiments/: its records
    (experiments/README.md); None for an installed wheel, which has none."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "experiments"
    return folder if (root / "pyproject.toml").is_file() and folder.is_dir() else None


#: The word a cut run's file takes after a dash (NAME-partial.yaml, e2e-...-partial.json),
#: so it goes beside, never over, the complete results of an earlier run (docs/design.md §7).
PARTIAL = "partial"


def partial_path(path: Path) -> Path:
    """Where a cut run writes what it measured instead of `path`: NAME-partial.SUFFIX."""
    return path.with_name(f"{path.stem}-{PARTIAL}{path.suffix}")


def stale_plot_note(plot: Path, data: Path) -> Optional[str]:
    """After `data` was written without a new plot (--no-plot, or cut before it): one line
    saying that the plot beside it, if any, is an earlier run's and shows other results; None
    when there is none. The plot is left alone: it may be another file's (a.yaml and a.json
    share a.png), and a user's file is never deleted behind their back."""
    if not (plot.exists() or plot.is_symlink()):
        return None
    return f"{plot} is an earlier run's plot: it does not show this {data.name}"
