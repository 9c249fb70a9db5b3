"""Calibration profiles (docs/design.md §5): schema, I/O and lookup.

    from bole_cli.profiles import find_profile, load_profile, lookup_budget
    path = find_profile("a100", "Qwen/Qwen3.5-9B")          # or GpuSpec / ModelSpec
    entry, note = lookup_budget(load_profile(path), batch=8, kv_len=3000)
    entry["b_ver"], entry["n_star"]

    from bole_cli.profiles import merge_section           # `bole tune-kernels`
    merge_section(path, "kernels", {"tree_verify/T64/HV32": {"BLOCK_T": 64, ...}})
"""

from bole_cli.profiles.io import (
    dump_profile,
    load_profile,
    merge_section,
    parse_profile,
    profile_path,
    save_profile,
    shipped_profiles_dir,
    update_profile,
    user_profiles_dir,
    default_search_dirs,
)
from bole_cli.profiles.lookup import find_profile, lookup_budget
from bole_cli.profiles.schema import KINDS, PROFILE_VERSION, draft_vocab_of, drafter_words, validate_profile

__all__ = [
    "KINDS",
    "PROFILE_VERSION",
    "default_search_dirs",
    "draft_vocab_of",
    "drafter_words",
    "dump_profile",
    "find_profile",
    "load_profile",
    "lookup_budget",
    "merge_section",
    "parse_profile",
    "profile_path",
    "save_profile",
    "shipped_profiles_dir",
    "update_profile",
    "user_profiles_dir",
    "validate_profile",
]
