"""Kernel launch-config tuning (`bole tune-kernels`) and the run-time tuned-table lookup.

    from bole_cli.tuning import install_tuned_tables
    install_tuned_tables()            # this GPU's tables -> bole_cli.kernels.configs resolver

Modules:
  space    search space per kernel (BC/BV/BN/BD, num_warps, num_stages; precision is not
           searched: it changes numerics), candidate sampling, fingerprints
  buckets  shape buckets (kernel, model shape, batch, nodes) and the nearest-bucket lookup
  tables   the kernels profile on disk (GPU-wide profiles/<gpu>/kernels.yaml, keyed by device
           name + Triton version + bucket), atomic merges, the resolver, install_tuned_tables
  checks   the correctness gate (float64 references) that every candidate passes first
  study    one Optuna study per bucket: sampler, slow-trial pruner, default-vs-best
           confirmation, resumable storage (SQLite, or a journal file without sqlalchemy)
  gpu      inputs and CUDA-graph timing on the GPU (reuses bole_cli.bench.kernel_bench)

Importing this package is light (no torch, triton or optuna): the heavy imports happen in
the functions that need them.
"""

from bole_cli.tuning.buckets import Bucket, nearest_bucket, parse_bucket_key, plan_buckets
from bole_cli.tuning.space import KERNELS, SPACES, candidates, sample_candidates, search_space
from bole_cli.tuning.tables import (
    InstalledTables,
    TunedEntry,
    install_tuned_tables,
    kernels_profile_path,
    load_tuned_entries,
    make_resolver,
    record_entries,
    table_paths,
)

__all__ = [
    "Bucket",
    "InstalledTables",
    "KERNELS",
    "SPACES",
    "TunedEntry",
    "candidates",
    "install_tuned_tables",
    "kernels_profile_path",
    "load_tuned_entries",
    "make_resolver",
    "nearest_bucket",
    "parse_bucket_key",
    "plan_buckets",
    "record_entries",
    "sample_candidates",
    "search_space",
    "table_paths",
]
