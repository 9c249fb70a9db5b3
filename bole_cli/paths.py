"""Where Bole keeps its per-user files: profiles, tuning studies, locks, unpacked wheels,
bench results."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$BOLE_CACHE_DIR, else $XDG_CACHE_HOME/bole, else ~/.cache/bole."""
    env = os.environ.get("BOLE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "bole"


def results_dir() -> Path:
    """Where `bole bench` writes a user's results unless --out-dir says otherwise: the
    cache, never the working directory (in a checkout that would overwrite the
    repository's own records in experiments/results/)."""
    return cache_dir() / "results"
