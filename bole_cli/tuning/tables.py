"""Writing tuned tables: the GPU-wide kernels profile that `bole tune-kernels` fills, and
the entries in force that a retune tries first (docs/design.md §5).

The format, the search order and the lookup at launch are bole_cli.kernels.tuned_tables';
this module only writes through its names (device keys, bucket keys, the section).
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

from bole_cli.errors import InputError

KERNELS_MODEL = "*"  # the model field of a GPU-wide kernels profile


def held_configs(paths: Sequence["str | os.PathLike[str]"], device_name: str,
                 triton_version: str) -> dict[str, dict]:
    """Bucket key -> the tuned config the lookup would use from these profiles (buckets
    where the built-in config won are left out): the incumbents a retune must try."""
    from bole_cli.kernels.tuned_tables import load_tuned_entries

    entries, _ = load_tuned_entries(paths, device_name, triton_version)
    return {e.bucket.key: dict(e.config) for e in entries if not e.is_default}


def new_kernels_profile(gpu_key: str, device_name: str, *, torch_version: Optional[str],
                        triton_version: str, command: str) -> dict:
    """The skeleton of a GPU-wide kernels profile (merge_section's `create`)."""
    from bole_cli import __version__

    return {
        "gpu": gpu_key,
        "model": KERNELS_MODEL,
        "provenance": {
            "kind": "measured",
            "partial": False,
            "note": "GPU-wide tuned kernel launch configs (bole tune-kernels); the kernels "
                    "section is keyed by device name and Triton version, then shape bucket",
            "bole_version": __version__,
            "torch_version": None if torch_version is None else str(torch_version),
            "triton_version": str(triton_version),
            "device_name": str(device_name),
            "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "command": command,
        },
    }


def check_kernels_profile(path: "str | os.PathLike[str]", what: str, gpu_key: Optional[str] = None) -> None:
    """Refuse, before any bucket is tuned, a profile the merge (record_entries) would refuse
    after the first one: not named .yaml/.yml, unreadable as a profile, or (once the GPU is
    known) another GPU's. Writability and the repository's records: console.check_writable."""
    from bole_cli.profiles.io import PROFILE_SUFFIXES, load_profile

    path = Path(path)
    if path.suffix.lower() not in PROFILE_SUFFIXES:
        raise InputError(f"{what}: {path}: a kernels profile is YAML; give a .yaml file path")
    if not path.is_file():
        return
    try:
        data = load_profile(path)
    except InputError as exc:
        raise InputError(f"{what}: {exc}; it is not overwritten") from None
    if gpu_key is not None and data.get("gpu") != gpu_key:
        raise InputError(f"{what}: {path} holds gpu {data.get('gpu')!r}, not this GPU's {gpu_key!r}; "
                         "choose another file")


def record_entries(path: "str | os.PathLike[str]", device_name: str, triton_version: str,
                   entries: Mapping[str, dict], *, create: Optional[dict] = None) -> dict:
    """Merge tuned entries {bucket key: entry} into the profile's kernels section for
    (device, triton), keeping every other device's entries and every other section.
    Atomic, and merged under the profile's lock (profiles.io.update_profile)."""
    from bole_cli.kernels.buckets import parse_bucket_key
    from bole_cli.kernels.tuned_tables import SECTION, device_key
    from bole_cli.profiles.io import update_profile

    path = Path(path)
    for bkey in entries:
        parse_bucket_key(bkey)  # refuse to write what could not be read back

    def merge(data: dict) -> dict:
        if create is not None and data.get("gpu") != create.get("gpu"):
            raise InputError(f"{path}: holds gpu {data.get('gpu')!r}, not {create.get('gpu')!r}; "
                             "choose another --profile")
        section = dict(data.get(SECTION) or {})
        dkey = device_key(device_name, triton_version)
        table = dict(section.get(dkey) or {})
        table.update({k: dict(v) for k, v in entries.items()})
        section[dkey] = dict(sorted(table.items()))
        return {SECTION: section}

    return update_profile(path, merge, create=create)
