"""Reading and writing profiles: atomic writes, section merges, default locations."""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from bole_cli.console import atomic_write_text
from bole_cli.errors import InputError
from bole_cli.files import dump_yaml
from bole_cli.paths import shipped_profiles_dir
from bole_cli.profiles.schema import PROFILE_VERSION, validate_profile

_SIG_DIGITS = 5

#: The names a profile file may take (a profile is YAML): calibrate's and tune-kernels' files.
PROFILE_SUFFIXES = (".yaml", ".yml")


def user_profiles_dir() -> Path:
    """Where `bole calibrate` writes by default: <cache>/profiles (bole_cli.paths.cache_dir:
    $BOLE_CACHE_DIR, else $XDG_CACHE_HOME/bole, else ~/.cache/bole)."""
    from bole_cli.paths import cache_dir

    return cache_dir() / "profiles"


def default_search_dirs() -> list[Path]:
    return [user_profiles_dir(), shipped_profiles_dir()]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"


def profile_path(directory: "str | os.PathLike[str]", gpu_key: str, model_name: str,
                 draft_vocab: Optional[int] = None) -> Path:
    """<directory>/<gpu>/<model short name>.yaml, e.g. profiles/a100/Qwen3.5-9B.yaml; a
    hot-token head's (`draft_vocab`) beside it as Qwen3.5-9B-vocab32768.yaml, so that it never
    replaces the full vocabulary's profile that `bole serve` reads by default."""
    tail = f"-vocab{draft_vocab}" if draft_vocab else ""
    return Path(directory) / _slug(gpu_key.lower()) / f"{_slug(model_name.rsplit('/', 1)[-1])}{tail}.yaml"


def _round(obj: Any) -> Any:
    """Floats to a few significant digits so the YAML stays readable."""
    if isinstance(obj, float) and math.isfinite(obj) and obj != 0:
        return float(f"{obj:.{_SIG_DIGITS}g}")
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v) for v in obj]
    return obj


_KEY_ORDER = ("bole_profile", "gpu", "model", "dtype", "draft_vocab", "provenance", "eps", "grid",
              "acceptance", "configs", "kernels")


def dump_profile(data: dict) -> str:
    """YAML text: known sections in schema order, then any others as they came."""
    ordered = {k: data[k] for k in _KEY_ORDER if k in data}
    ordered.update((k, v) for k, v in data.items() if k not in ordered)
    return dump_yaml(_round(ordered), sort_keys=False, default_flow_style=None, width=100,
                     allow_unicode=True)


def parse_profile(text: str, source: str) -> dict:
    from bole_cli.files import parse_yaml

    return validate_profile(parse_yaml(text, source), source)


def load_profile(path: "str | os.PathLike[str]") -> dict:
    """Read and validate a profile; InputError names the file and the field at fault."""
    from bole_cli.files import read_text

    path = Path(path)
    if str(path) and not os.path.lexists(path):
        raise InputError(f"{path}: no such profile")
    return parse_profile(read_text(path), str(path))


def save_profile(path: "str | os.PathLike[str]", data: dict) -> Path:
    """Validate and write atomically (readers see the old or the new file, never half)."""
    validate_profile(data, str(path))
    return atomic_write_text(path, dump_profile(data))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write cycles on one directory (POSIX; a no-op elsewhere)."""
    from bole_cli.errors import BoleError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BoleError(f"cannot write {path} ({exc.strerror or exc})") from None
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def update_profile(path: "str | os.PathLike[str]", updates: "dict | Callable[[dict], dict]", *,
                   create: Optional[dict] = None) -> dict:
    """Replace the top-level keys in `updates`, keep every other section, write atomically.

    `updates` may be a function of the current profile (called under the lock, so a
    read-merge-write of one section cannot lose another writer's change). A missing file
    is an error unless `create` gives the skeleton to start from (its gpu, model and
    provenance); an existing file for another gpu/model is an error.
    """
    path = Path(path)
    with _locked(path):
        existed = path.exists()
        if existed:
            data = load_profile(path)
        elif create is not None:
            data = {"bole_profile": PROFILE_VERSION, **create}
        else:
            raise InputError(f"{path}: no such profile; run `bole calibrate` first")
        if callable(updates):
            updates = updates(data)
        for key in ("gpu", "model") if existed else ():
            new = updates.get(key)
            if new is not None and new != data.get(key):
                raise InputError(f"{path}: holds {key} {data.get(key)!r}, not {new!r}; "
                                 "choose another file")
        data.update(updates)
        data["bole_profile"] = PROFILE_VERSION
        save_profile(path, data)
        return data


def merge_section(path: "str | os.PathLike[str]", key: str, section: Any, *,
                  create: Optional[dict] = None) -> dict:
    """Set one top-level section (e.g. "kernels") of a profile, keeping all the others.

    Used by `bole tune-kernels`: merge_section(path, "kernels", {...}). To start a new
    file give `create={"gpu": ..., "model": ..., "provenance": {...}}`.
    """
    if key == "bole_profile":
        raise InputError("merge_section: the version key is not a section")
    return update_profile(path, {key: section}, create=create)
