"""Where Bole keeps its per-user files: profiles, tuning studies, locks, unpacked wheels."""

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
