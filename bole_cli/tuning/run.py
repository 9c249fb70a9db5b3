"""The work of `bole tune-kernels` (docs/design.md §5), for the command to render.

`dry_run`: the search space per kernel and model shape, the plan's size and time estimate,
and a sample of candidates checked against the float64 references on a tiny shape (the
Triton interpreter on a CPU: no GPU needed). `tune`: one Optuna study per bucket on this
GPU, each finished bucket merged into the kernels profile at once (an interrupted run keeps
what it finished and resumes from the studies).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from bole_cli.errors import BoleError
from bole_cli.tuning.plan import plan_buckets


@dataclass
class DryRun:
    kernels: list[str]
    buckets: list  # bole_cli.kernels.buckets.Bucket
    spaces: list[dict]  # per (kernel, model shape): space, size, models, the built-in config
    rows: list[dict]  # the sampled candidates' verdicts
    estimate_s: float
    trials: int
    sampler: str
    where: str  # where the checks ran

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if not r["ok"]]

    def buckets_per_kernel(self) -> dict[str, int]:
        return {k: sum(1 for b in self.buckets if b.kernel == k) for k in self.kernels}

    def to_dict(self) -> dict:
        return {"dry_run": True, "kernels": list(self.kernels),
                "spaces": [{k: v for k, v in s.items() if k != "default"} for s in self.spaces],
                "buckets": [b.key for b in self.buckets], "estimate_s": self.estimate_s, "trials": self.trials,
                "sampler": self.sampler, "validated": self.rows, "validated_on": self.where}


def dry_run(specs: Sequence, kernels: Sequence[str], batches: Sequence[int], nodes: Sequence[int], *,
            sample: int, seed: int, trials: int, sampler: str) -> DryRun:
    """The plan and its search spaces, and `sample` candidates per kernel (its built-in
    config first, from its first model shape) checked against the references."""
    from bole_cli.kernels._env import interpreting
    from bole_cli.tuning.gpu import dry_run_checks
    from bole_cli.tuning.space import format_config, sample_candidates, search_space, space_size
    from bole_cli.tuning.study import builtin_default, estimate_seconds

    buckets, owners = plan_buckets(specs, kernels, batches, nodes)
    spaces = []
    checks: list[tuple[str, dict]] = []
    seen_kernel = set()
    for (kernel, model), models in owners.items():
        first = next(b for b in buckets if b.kernel == kernel and b.model == model)
        default = builtin_default(first)
        space = search_space(kernel, first.dims, include=default)
        spaces.append({"kernel": kernel, "shape": first.model_key, "models": models, "space": space,
                       "size": space_size(space), "default": format_config(default),
                       "default_config": default})
        if kernel not in seen_kernel:  # a sample per kernel, from its first model shape
            seen_kernel.add(kernel)
            checks.extend((kernel, c) for c in sample_candidates(space, sample, seed, first=default))
    device = "cpu" if interpreting() else "cuda"  # kernels compiled for a GPU need GPU tensors
    rows = dry_run_checks(checks, device=device, seed=seed)
    where = "Triton interpreter on the CPU" if device == "cpu" else "compiled, on the GPU"
    return DryRun(list(kernels), buckets, spaces, rows, estimate_seconds(buckets, trials, sampler), trials,
                  sampler, where)


@dataclass
class TuneRun:
    device_name: str
    gpu_key: str
    triton_version: str
    torch_version: str
    profile_path: Path
    storage_path: Any
    storage_kind: str
    settings: Any  # bole_cli.tuning.study.TuneSettings
    buckets: list
    estimate_s: float
    budget_s: Optional[float]
    saved: list[str] = field(default_factory=list)  # bucket keys written to the profile so far
    results: list = field(default_factory=list)  # bole_cli.tuning.study.BucketResult
    seconds: float = 0.0

    @property
    def failed(self) -> list:
        return [r for r in self.results if r.failed]

    def to_dict(self) -> dict:
        s = self.settings
        return {
            "device": self.device_name, "gpu": self.gpu_key, "triton": self.triton_version,
            "torch": self.torch_version, "profile": str(self.profile_path), "storage": str(self.storage_path),
            "storage_kind": self.storage_kind, "estimate_s": self.estimate_s, "seconds": self.seconds,
            "settings": {"trials": s.trials, "sampler": s.sampler, "seed": s.seed, "quick_ms": s.quick_ms,
                         "full_ms": s.full_ms, "slow_ratio": s.slow_ratio, "margin": s.margin},
            "results": [r.to_dict() for r in self.results],
        }


def tune(specs: Sequence, kernels: Sequence[str], batches: Sequence[int], nodes: Sequence[int], *,
         trials: int, sampler: str, seed: int, profile: Optional[Path] = None, study_db: Optional[Path] = None,
         fresh: bool = False, max_minutes: Optional[float] = None,
         on_start: Optional[Callable[[TuneRun], None]] = None,
         on_trial: Optional[Callable[[Any, dict], None]] = None,
         on_bucket: Optional[Callable[[Any], None]] = None) -> TuneRun:
    """Tune every bucket of the plan on this GPU and merge each finished bucket into the
    kernels profile (default: the user's <gpu>/kernels.yaml). on_start(run) comes once the
    run is set up (run.saved then grows as buckets are written); on_trial(bucket, info) per
    trial; on_bucket(result) per finished bucket."""
    buckets, owners = plan_buckets(specs, kernels, batches, nodes)
    import torch

    if not torch.cuda.is_available():
        raise BoleError("bole tune-kernels times the kernels and needs a CUDA GPU (none found); "
                        "`bole tune-kernels --dry-run` prints the search space and checks candidates on the CPU")
    import triton

    from bole_cli.console import check_writable, invoked_command
    from bole_cli.kernels.tuned_tables import gpu_key_for, kernels_profile_path, table_paths
    from bole_cli.paths import default_named
    from bole_cli.profiles.io import user_profiles_dir
    from bole_cli.timing import warm_gpu
    from bole_cli.tuning.gpu import GpuEvaluator
    from bole_cli.tuning.study import (TuneSettings, builtin_configs, default_storage_path, estimate_seconds,
                                       import_optuna, open_storage, run_tuning)
    from bole_cli.tuning.tables import check_kernels_profile, held_configs, new_kernels_profile, record_entries

    optuna = import_optuna()
    device_name = torch.cuda.get_device_name()
    gpu_key = gpu_key_for(device_name)
    profile_path = Path(profile) if profile is not None else kernels_profile_path(user_profiles_dir(), gpu_key)
    what = "--profile" if profile is not None else default_named("kernels profile")
    check_writable(profile_path, what)
    check_kernels_profile(profile_path, what, gpu_key)
    storage, storage_path, storage_kind = open_storage(optuna, study_db or default_storage_path())
    run = TuneRun(device_name, gpu_key, triton.__version__, str(torch.__version__), profile_path, storage_path,
                  storage_kind, TuneSettings(trials=trials, sampler=sampler, seed=seed), buckets,
                  estimate_seconds(buckets, trials, sampler), max_minutes * 60 if max_minutes is not None else None)
    if on_start is not None:
        on_start(run)
    create = new_kernels_profile(gpu_key, device_name, torch_version=run.torch_version,
                                 triton_version=run.triton_version, command=invoked_command())
    # the entries in force now (the table written to first, then the lookup's order)
    incumbents = held_configs([profile_path, *table_paths(device_name)], device_name, run.triton_version)

    def on_result(res):
        if not res.failed:
            record_entries(profile_path, device_name, run.triton_version, {res.bucket.key: res.to_entry()},
                           create=create)
            run.saved.append(res.bucket.key)
        if on_bucket is not None:
            on_bucket(res)

    started = time.time()
    evaluator = GpuEvaluator(seed=seed)
    warm_gpu(torch)
    with builtin_configs():
        run.results = run_tuning(optuna, storage, buckets, evaluator, run.settings, owners=owners, fresh=fresh,
                                 budget_s=run.budget_s, on_trial=on_trial, on_result=on_result,
                                 incumbents=incumbents)
    run.seconds = time.time() - started
    return run
