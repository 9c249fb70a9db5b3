"""The tuned-table lookup the kernels use at launch (docs/design.md §5): reading a GPU's
kernels table, the resolver that `launch_config` consults, and the one-line notices.

The first launch installs this GPU's tables (`tuned_config`); `bole tune-kernels`
(bole_cli.tuning) only writes them, through the names defined here.

Where: a GPU-wide kernels profile, `<profiles dir>/<gpu>/kernels.yaml` (gpu: the catalogue
key such as h200, else the device name made file-safe), in the user cache directory
($XDG_CACHE_HOME/bole/profiles, written by `bole tune-kernels`) and in the shipped
profiles/ (the repository's tables). It is an ordinary Bole profile (model "*") whose
`kernels` section is keyed by device name and Triton version, then by shape bucket:

    kernels:
      NVIDIA H200 | triton 3.5.0:
        tree_verify/H16-HV32-K128-V128/B4/N64:
          config: {BC: 16, BV: 64, num_warps: 4, num_stages: 1}
          us: 21.3            # median microseconds of the tuned config
          default_us: 24.9    # the built-in config, timed in the same run
          speedup: 1.17
          default: false      # true: the built-in config won; the lookup then keeps the
                              # built-in rule (which adapts to the exact shape)
          ...

The GDN kernels only see shapes, so one table serves every model with that shape (Qwen3.5
4B and 9B share theirs). `--profile FILE` may also name a model profile: its other
sections are kept, and `install_tuned_tables(model=...)` reads its kernels section first.

Lookup order (first wins per bucket): $BOLE_KERNEL_TABLES (a file; "off" disables the
tables), the model's profile when a model is given, the user's kernels.yaml, the shipped
one. Entries for the running Triton version beat entries made with another version (used,
with a notice, when no exact one exists: launch parameters rarely change meaning between
Triton releases, but re-tuning is advised).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from bole_cli import env
from bole_cli.errors import InputError
from bole_cli.kernels.buckets import Bucket, nearest_bucket, parse_bucket_key
from bole_cli.kernels.verify_path import is_blocked_config, is_tile_launch

SECTION = "kernels"
ENV_VAR = env.KERNEL_TABLES

# The config keys a tuned table may set per kernel (the tuner's search space,
# bole_cli.tuning.space.SPACES, searches exactly these); everything else keeps the built-in value.
TUNED_KEYS: dict[str, tuple[str, ...]] = {
    "tree_verify": ("BC", "VSPLIT", "BV", "BK", "num_warps", "num_stages"),
    "tree_commit_replay": ("BV", "num_warps", "num_stages"),
    "tree_commit": ("BV", "num_warps", "num_stages"),
    "tree_conv": ("BN", "BD", "num_warps", "num_stages"),
}

Resolver = Callable[[str, dict], Optional[dict]]  # (kernel, launch shape) -> tuned config or None


# ---- names ------------------------------------------------------------------------------

def _norm_device(name: str) -> str:
    return " ".join(str(name).split()).lower()


def device_key(device_name: str, triton_version: str) -> str:
    return f"{' '.join(str(device_name).split())} | triton {triton_version}"


def parse_device_key(key: str) -> Optional[tuple[str, str]]:
    m = re.match(r"^(?P<dev>.+?)\s*\|\s*triton\s+(?P<ver>\S+)\s*$", str(key))
    return (m["dev"], m["ver"]) if m else None


def gpu_key_for(device_name: str) -> str:
    """The catalogue key of a device name ("NVIDIA H200" -> "h200"), else the name slugged."""
    from bole_cli.catalog.hardware import match_gpu

    spec = match_gpu(device_name)
    if spec is not None:
        return spec.key
    return re.sub(r"[^a-z0-9._-]+", "_", device_name.lower()).strip("._") or "gpu"


def kernels_profile_path(directory: "str | os.PathLike[str]", gpu_key: str) -> Path:
    return Path(directory) / re.sub(r"[^A-Za-z0-9._-]+", "_", gpu_key.lower()) / "kernels.yaml"


# ---- entries ----------------------------------------------------------------------------

@dataclass
class TunedEntry:
    bucket: Bucket
    config: dict
    is_default: bool = False
    us: Optional[float] = None
    default_us: Optional[float] = None
    triton_version: str = ""
    source: str = ""

    def resolved(self) -> Optional[dict]:
        """What the resolver hands launch_config: None where the built-in config won."""
        return None if self.is_default else dict(self.config)


def _parse_entry(bucket_key: str, value: Any, where: str) -> TunedEntry:
    bucket = parse_bucket_key(bucket_key)
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        raise InputError(f"{where}: expected a mapping with a 'config' mapping")
    allowed = set(TUNED_KEYS[bucket.kernel])
    cfg = value["config"]
    bad = [k for k, v in cfg.items() if k not in allowed or isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad or not cfg:
        raise InputError(f"{where}.config: expected positive integers for {sorted(allowed)}, got {cfg}")
    if bucket.kernel == "tree_verify":  # a config tuned for the other kernel (an older table)
        blocked_bucket = not is_tile_launch(bucket.launch_shape())
        if is_blocked_config(cfg) != blocked_bucket:
            raise InputError(f"{where}: a {'one-tile' if blocked_bucket else 'blocked'}-kernel config "
                             f"{cfg} for a {'> 64' if blocked_bucket else '<= 64'}-node bucket "
                             f"(tuned before tree_verify had two kernels?): rerun bole tune-kernels")
    is_default = value.get("default", False)
    if not isinstance(is_default, bool):
        raise InputError(f"{where}.default: expected true or false")

    def num(key: str) -> Optional[float]:
        x = value.get(key)
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None

    return TunedEntry(bucket, dict(cfg), is_default, num("us"), num("default_us"))


def entries_for_device(section: Mapping, device_name: str, source: str = "") -> tuple[dict[str, list[TunedEntry]], list[str]]:
    """Entries of one kernels section for a device: {triton version: [entries]} and notes
    on what was skipped (malformed entries never stop the rest from loading)."""
    out: dict[str, list[TunedEntry]] = {}
    notes: list[str] = []
    if not isinstance(section, Mapping):
        return out, notes
    want = _norm_device(device_name)
    for dkey, table in section.items():
        parsed = parse_device_key(dkey)
        if parsed is None or _norm_device(parsed[0]) != want or not isinstance(table, Mapping):
            continue
        for bkey, value in table.items():
            try:
                e = _parse_entry(bkey, value, f"{source}: kernels[{dkey!r}][{bkey!r}]")
            except InputError as exc:
                notes.append(str(exc))
                continue
            e.triton_version, e.source = parsed[1], source
            out.setdefault(parsed[1], []).append(e)
    return out, notes


def _version_tuple(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.findall(r"\d+|[a-z]+", v))


def _minor_index(vt: tuple) -> int:
    return 1000 * (vt[0] if vt else 0) + (vt[1] if len(vt) > 1 else 0)


def load_tuned_entries(paths: Sequence["str | os.PathLike[str]"], device_name: str,
                       triton_version: str) -> tuple[list[TunedEntry], list[str]]:
    """Entries for (device, triton) from profiles in priority order, one per bucket.

    Per bucket: an entry made with this Triton version beats one made with another (the
    nearest minor release first, then the newer), then the earlier file wins. Unreadable
    files are skipped with a note.
    """
    from bole_cli.profiles.io import load_profile

    best: dict[str, tuple[tuple, TunedEntry]] = {}
    notes: list[str] = []
    for order, path in enumerate(paths):
        path = Path(path)
        if not path.is_file():
            continue
        try:
            data = load_profile(path)
        except InputError as exc:
            notes.append(f"skipped {exc}")
            continue
        by_version, bad = entries_for_device(data.get(SECTION) or {}, device_name, str(path))
        notes.extend(bad)
        for version, entries in by_version.items():
            exact = version == triton_version
            vt = _version_tuple(version)
            gap = abs(_minor_index(vt) - _minor_index(_version_tuple(triton_version)))
            for e in entries:
                rank = (0 if exact else 1, gap, tuple(-x for x in vt), order)
                cur = best.get(e.bucket.key)
                if cur is None or rank < cur[0]:
                    best[e.bucket.key] = (rank, e)
    return [e for _, e in sorted(best.values(), key=lambda x: x[1].bucket)], notes


def make_resolver(entries: Sequence[TunedEntry]) -> Resolver:
    """launch_config's resolver: (kernel, shape) -> tuned config of the nearest bucket, or
    None (built-in) where there is no applicable bucket or the built-in config won there.
    Answers are memoised per (kernel, shape): the lookup costs a dict hit per launch."""
    by_bucket = {e.bucket: e for e in entries}
    buckets = list(by_bucket)
    memo: dict[tuple, Optional[dict]] = {}

    def resolve(kernel: str, shape: dict) -> Optional[dict]:
        key = (kernel, tuple(sorted(shape.items())))
        try:
            return memo[key]
        except KeyError:
            pass
        except TypeError:  # unhashable values in the shape: no memo
            key = None
        b = nearest_bucket(buckets, kernel, shape)
        cfg = by_bucket[b].resolved() if b is not None else None
        if key is not None:
            memo[key] = cfg
        return cfg

    resolve.entries = list(entries)  # type: ignore[attr-defined]
    return resolve


# ---- the installed resolver -------------------------------------------------------------

# A resolver maps (kernel, shape dict) to a config dict or None (install_tuned_tables).
_resolver: Optional[Resolver] = None
_autoload = True  # the first launch installs this GPU's tuned tables (bole tune-kernels)


def set_resolver(fn: Optional[Resolver]) -> None:
    """Install a tuned-table resolver; an explicit choice (even None) stops the autoload."""
    global _resolver, _autoload
    _resolver, _autoload = fn, False


def get_resolver() -> Optional[Resolver]:
    return _resolver


def tuned_config(kernel: str, shape: dict) -> Optional[dict]:
    """The tuned config for a launch of `kernel` at `shape`, or None (built-in configs);
    the first call installs this GPU's tables."""
    if _autoload:
        _load_tables_once()
    return _resolver(kernel, shape) if _resolver is not None else None


def _load_tables_once() -> None:
    global _autoload
    _autoload = False
    try:
        install_tuned_tables()  # a no-op without CUDA
    except Exception as exc:  # noqa: BLE001 - a bad table must never break a launch
        print(f"bole: note: tuned kernel tables not loaded ({exc})", file=sys.stderr)


# ---- installing the resolver ------------------------------------------------------------

@dataclass
class InstalledTables:
    device_name: str
    triton_version: str
    entries: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"device_name": self.device_name, "triton_version": self.triton_version,
                "entries": len(self.entries), "sources": self.sources, "notes": self.notes}


_NOTICED: set = set()


def notice(message: str) -> None:
    """One line on stderr, once per process per message."""
    if message in _NOTICED:
        return
    _NOTICED.add(message)
    print(f"bole: note: {message}", file=sys.stderr, flush=True)


def tables_off(value: Optional[str]) -> bool:
    """BOLE_KERNEL_TABLES turns the tables off by the one flag rule (bole_cli/env.py) or
    "none"; any other value names table files."""
    return env.flag(value, True) is False or (value or "").strip().lower() == "none"


def table_paths(device_name: str, model: Any = None) -> list[Path]:
    """Where install_tuned_tables looks, in priority order (see the module doc)."""
    from bole_cli.profiles.io import default_search_dirs

    paths: list[Path] = []
    value = os.environ.get(ENV_VAR, "").strip()
    if value and not tables_off(value):
        paths.append(Path(value))
    gpu = gpu_key_for(device_name)
    if model is not None:
        from bole_cli.profiles.lookup import find_profile

        found = find_profile(gpu, model)
        if found is not None:
            paths.append(found)
    paths.extend(kernels_profile_path(d, gpu) for d in default_search_dirs())
    return paths


def install_tuned_tables(device_name: Optional[str] = None, *, model: Any = None,
                         paths: Optional[Sequence["str | os.PathLike[str]"]] = None,
                         triton_version: Optional[str] = None,
                         quiet: bool = False) -> Optional[InstalledTables]:
    """Install the tuned-table resolver for this GPU (the one `launch_config` consults).

    device_name: as torch.cuda.get_device_name() says it (default: the current CUDA
    device; without CUDA nothing is installed and None is returned). model: a ModelSpec
    or name whose profile's kernels section is read first. paths: the profiles to read
    instead of the default search (see `table_paths`). With no table for the GPU the
    built-in configs stay in force and a one-line notice goes to stderr (once).
    $BOLE_KERNEL_TABLES=off uninstalls the resolver (for A/B timing).
    """
    if tables_off(os.environ.get(ENV_VAR)):
        set_resolver(None)
        return None
    if device_name is None:
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    if triton_version is None:
        import triton

        triton_version = triton.__version__
    search = list(paths) if paths is not None else table_paths(device_name, model)
    entries, notes = load_tuned_entries(search, device_name, triton_version)
    info = InstalledTables(device_name, triton_version, entries,
                           sorted({e.source for e in entries}), notes)
    if not entries:
        set_resolver(None)
        if not quiet:
            notice(f"no tuned kernel table for {device_name} (triton {triton_version}); using the "
                    "built-in launch configs (`bole tune-kernels` makes one)")
        return info
    set_resolver(make_resolver(entries))
    other = sorted({e.triton_version for e in entries if e.triton_version != triton_version})
    if other and not quiet:
        notice(f"tuned kernel table for {device_name} made with triton {', '.join(other)} "
                f"(running {triton_version}); using it - re-run `bole tune-kernels` to refresh")
    return info
