"""`bole tune-kernels`: the offline Optuna tuner of the kernels' launch configs
(docs/design.md §5). It writes tuned tables; the kernels read them at launch through
bole_cli.kernels.tuned_tables (install_tuned_tables, the resolver), never through here.

Modules:
  space    search space per kernel (BC/BV/BN/BD, num_warps, num_stages; precision is not
           searched: it changes numerics), candidate sampling, fingerprints
  plan     the shape buckets (bole_cli.kernels.buckets) of the requested models, batches
           and tree sizes
  checks   the correctness gate (float64 references) that every candidate passes first
  study    one Optuna study per bucket: sampler, slow-trial pruner, default-vs-best
           confirmation, resumable storage (SQLite, or a journal file without sqlalchemy)
  gpu      the evaluator on the GPU: inputs and CUDA-graph timing from bole_cli.timing
  tables   writing the GPU-wide kernels profile (atomic merges) and the entries in force
  run      the command's work: the dry run (space + sampled checks) and a tuning run

Importing this package is light (no torch, triton or optuna): the heavy imports happen in
the functions that need them.
"""

from bole_cli.tuning.plan import plan_buckets
from bole_cli.tuning.space import KERNELS, SPACES, candidates, sample_candidates, search_space
from bole_cli.tuning.tables import held_configs, new_kernels_profile, record_entries

__all__ = [
    "KERNELS",
    "SPACES",
    "candidates",
    "held_configs",
    "new_kernels_profile",
    "plan_buckets",
    "record_entries",
    "sample_candidates",
    "search_space",
]
