"""Shared output helpers: Rich consoles, JSON emission and atomic file writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps_json(data: Any) -> str:
    """Stable, machine-readable JSON (sorted keys, no NaN surprises hidden)."""
    return json.dumps(data, indent=2, sort_keys=True, default=_jsonable)


def emit_json(data: Any) -> None:
    """Print JSON to stdout without Rich markup or wrapping."""
    print(dumps_json(data))


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: umask() is process-wide and briefly changes it


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write a file so a reader sees either the old or the new content, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a plain file respects the umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure atomically (format from the path's suffix)."""
    import io

    buf = io.BytesIO()
    suffix = Path(path).suffix.lstrip(".") or "png"
    fig.savefig(buf, format=suffix, dpi=120, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
