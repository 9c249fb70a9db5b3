"""Finding a profile and the budget for one serving configuration."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from bole_cli.errors import BoleError, InputError
from bole_cli.profiles.io import default_search_dirs, load_profile, profile_path
from bole_cli.profiles.schema import draft_vocab_of, drafter_words, failure_cell


def _names(gpu: Any, model: Any) -> tuple[str, str]:
    gpu_key = getattr(gpu, "key", None) or str(gpu)
    model_name = getattr(model, "name", None) or str(model)
    return gpu_key, model_name


def find_profile(gpu: Any, model: Any,
                 search_dirs: Optional[Iterable["str | os.PathLike[str]"]] = None,
                 skipped: Optional[list[str]] = None, draft_vocab: Optional[int] = None) -> Optional[Path]:
    """The best profile for (gpu, model): a GpuSpec or catalogue key, a ModelSpec or name.

    Looks for <dir>/<gpu>/<model>.yaml in each search dir (default: the user cache
    directory, then the shipped profiles/). A complete measured profile wins over an
    estimated or partial one; between equals, the earlier directory wins. Unreadable
    candidates are skipped, each with its error appended to `skipped` (so a caller can say
    why a user's own profile was passed over). None when nothing is found. `draft_vocab`:
    the profile of a drafter over that many hot tokens (profile_path's name for it); one
    whose own field names another drafter (a file copied by hand) is skipped the same way.
    """
    gpu_key, model_name = _names(gpu, model)
    dirs = list(search_dirs) if search_dirs is not None else default_search_dirs()
    best: Optional[tuple[int, int, Path]] = None
    for order, d in enumerate(dirs):
        path = profile_path(d, gpu_key, model_name, draft_vocab)
        if not path.is_file():
            continue
        try:
            data = load_profile(path)
            recorded = draft_vocab_of(data, getattr(model, "vocab", None))
            if recorded != draft_vocab:
                raise InputError(f"{path}: prices a drafter over {drafter_words(recorded)}, "
                                 f"its name {drafter_words(draft_vocab)}")
        except InputError as exc:
            if skipped is not None:
                skipped.append(str(exc))
            continue
        prov = data["provenance"]
        rank = 0 if prov["kind"] == "measured" and not prov.get("partial") else 1
        if best is None or (rank, order) < best[:2]:
            best = (rank, order, path)
    return best[2] if best else None


def _nearest(values: Sequence[int], want: int) -> int:
    """Nearest in log scale (budgets and costs scale geometrically); ties go up."""
    lw = math.log(max(want, 1))
    return min(values, key=lambda v: (abs(math.log(v) - lw), -v))


def lookup_budget(profile: dict, batch: int, kv_len: int) -> tuple[dict, str]:
    """The profile entry for (batch, kv_len) and a note stating any fallback.

    Picks the nearest batch size present, then the nearest KV bucket present for it
    (both in log scale, ties to the larger). The note names what was asked, what was
    used and why (for example "batch 3 -> 4 (nearest of 1, 2, 4, 8, 16); kv_len 2500 ->
    4096 (nearest bucket of 1024, 4096, 16384); estimated profile").
    """
    if batch < 1 or kv_len < 0:
        raise InputError(f"lookup_budget: batch must be >= 1 and kv_len >= 0, got {batch}, {kv_len}")
    configs = profile.get("configs") or []
    if not configs:
        raise BoleError(f"profile for {profile.get('gpu')}/{profile.get('model')} holds no "
                        "budget configurations; run `bole calibrate`")
    batches = sorted({c["batch"] for c in configs})
    b = _nearest(batches, batch)
    kvs = sorted({c["kv_len"] for c in configs if c["batch"] == b})
    kv = _nearest(kvs, kv_len)
    entry = next(c for c in configs if c["batch"] == b and c["kv_len"] == kv)

    parts = []
    if b != batch:
        edge = " (outside the profile's range)" if batch < batches[0] or batch > batches[-1] else ""
        parts.append(f"batch {batch} -> {b}{edge} (nearest of {', '.join(map(str, batches))})")
    if kv != kv_len:
        edge = " (outside the profile's range)" if kv_len < kvs[0] or kv_len > kvs[-1] else ""
        parts.append(f"kv_len {kv_len} -> {kv}{edge} (nearest bucket of {', '.join(map(str, kvs))})")
    prov = profile.get("provenance", {})
    # the batch (or the batch's KV length) asked for was swept and failed (no memory, say)
    if b != batch or kv != kv_len:
        whole_batch = b != batch
        cell = failure_cell(batch, None if whole_batch else kv_len) + ", "
        if any(isinstance(f, str) and f.startswith(cell) for f in prov.get("failures") or []):
            asked = f"batch {batch}" + ("" if whole_batch else f", kv_len {kv_len}")
            parts.append(f"{asked} failed when calibrated (the profile's provenance: failures)")
    if prov.get("kind") == "estimated":
        parts.append("estimated profile")
    if prov.get("partial"):
        parts.append("partial profile")
    if entry.get("below_threshold"):
        parts.append(f"no grid point met Eq. 12's threshold here; B_ver is the smallest "
                     f"({entry['b_ver']})")
    note = "; ".join(parts) if parts else "exact match"
    return entry, note
