"""The search: one Optuna study per (kernel, shape bucket), resumable from storage.

Per trial (`_Objective`):
  1. the sampler proposes a config (TPE, or a grid capped at --trials points);
  2. a config already evaluated in this study is answered from it (TPE re-proposes
     categorical points often) and does not count against the trial budget;
  3. the evaluator checks it against the float64 reference on a small case: a wrong
     result is REJECTED, one that does not compile / exceeds shared memory is SKIPPED
     (both recorded as pruned trials with the reason in the user attrs, never timed);
  4. a quick timing (rep 10 ms) is reported; `SlowPruner` prunes it when it is more than
     2x the best full timing so far (clearly slow);
  5. the full timing (median of a CUDA-graph replay) is the trial's value.
The built-in default config is enqueued as the study's first trial and is never pruned.
Afterwards the best config and the default are re-timed in alternation (`confirm`); the
best is kept only when it beats the default by a margin, else the default is kept (and
marked), so tuning can never make a bucket slower than the built-in choice.

optuna is imported lazily (only `bole tune-kernels` needs it). Storage: SQLite through
optuna's RDBStorage when sqlalchemy and alembic import, else optuna's JournalStorage over
a file (no extra dependency); both resume an interrupted run.
"""

from __future__ import annotations

import contextlib
import ast
import functools
import hashlib
import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence

from bole_cli.errors import BoleError
from bole_cli.tuning.checks import Verdict
from bole_cli.tuning.space import search_space, space_fingerprint

if TYPE_CHECKING:  # bole_cli.kernels loads torch and triton: imported where used
    from bole_cli.kernels.buckets import Bucket

STUDY_VERSION = "v2"  # bump when the timing method changes meaning (v2: the verify timed as served)


@dataclass
class TuneSettings:
    trials: int = 12  # evaluated candidates per bucket (the default included)
    sampler: str = "tpe"  # "tpe" | "grid"
    seed: int = 0
    quick_ms: float = 10.0  # rep of the quick timing used for pruning
    full_ms: float = 40.0  # rep of the full timing (the trial's value)
    slow_ratio: float = 2.0  # prune when quick > slow_ratio x best so far
    confirm_rounds: int = 3  # alternating re-timings of best vs default
    margin: float = 0.02  # the best must beat the default by this fraction to be kept
    attempts_factor: int = 4  # hard cap on sampler proposals: trials x factor + 8


class Evaluator(Protocol):
    """What the search needs from a device (GpuEvaluator; fakes in the tests)."""

    device_name: str
    triton_version: str

    def default_config(self, bucket: Bucket) -> dict: ...

    def prepare(self, bucket: Bucket) -> None: ...

    def check(self, bucket: Bucket, config: dict) -> Verdict: ...

    def time(self, bucket: Bucket, config: dict, rep_ms: float) -> float: ...  # microseconds

    def release(self) -> None: ...


@dataclass
class BucketResult:
    bucket: Bucket
    config: Optional[dict]  # the stored config (the default when it won)
    us: Optional[float]
    default_config: dict
    default_us: Optional[float]
    is_default: bool
    counts: dict = field(default_factory=dict)  # outcome -> trials
    best_trial_config: Optional[dict] = None  # the search's best (even when not kept)
    best_trial_us: Optional[float] = None
    models: list = field(default_factory=list)
    failed: str = ""  # why nothing could be stored (the default itself failed)
    cut_short: bool = False  # the time budget ended the search early

    @property
    def speedup(self) -> Optional[float]:
        if self.us and self.default_us:
            return self.default_us / self.us
        return None

    def to_entry(self) -> dict:
        """The YAML entry (bole_cli.tuning.tables)."""
        import datetime as _dt

        return {
            "config": dict(self.config or {}),
            "us": self.us,
            "default_config": dict(self.default_config),
            "default_us": self.default_us,
            "speedup": self.speedup,
            "default": self.is_default,
            "trials": dict(self.counts),
            "models": list(self.models),
            "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        }

    def to_dict(self) -> dict:
        return {
            "kernel": self.bucket.kernel, "bucket": self.bucket.key, "model_shape": self.bucket.dims,
            "batch": self.bucket.batch, "nodes": self.bucket.nodes, "models": list(self.models),
            "config": self.config, "us": self.us, "default_config": self.default_config,
            "default_us": self.default_us, "speedup": self.speedup, "is_default": self.is_default,
            "best_trial_config": self.best_trial_config, "best_trial_us": self.best_trial_us,
            "trials": dict(self.counts), "failed": self.failed or None, "cut_short": self.cut_short,
        }


# ---- optuna plumbing --------------------------------------------------------------------

def import_optuna():
    """optuna, quiet; BoleError naming the fix when it is missing."""
    try:
        import optuna
    except ImportError as exc:
        raise BoleError(f"bole tune-kernels needs optuna ({exc}); pip install optuna "
                        "(optuna, colorlog, tqdm, numpy, packaging, PyYAML; sqlalchemy is optional)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    experimental = getattr(optuna.exceptions, "ExperimentalWarning", None)
    if experimental is not None:  # multivariate TPE is labelled experimental
        warnings.filterwarnings("ignore", category=experimental)
    return optuna


def default_storage_path() -> Path:
    """$XDG_CACHE_HOME/bole/tune/studies.sqlite3 (~/.cache when unset)."""
    from bole_cli.paths import cache_dir

    return cache_dir() / "tune" / "studies.sqlite3"


def _rdb_available() -> bool:
    try:
        import alembic  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        return False
    return True


def open_storage(optuna, path: "str | os.PathLike[str]", *, prefer: str = "auto") -> tuple[Any, Path, str]:
    """(storage, file, kind): SQLite (RDBStorage) when sqlalchemy + alembic are present
    (or the path ends in .journal / prefer="journal" asks otherwise), else a JournalStorage
    file next to it (suffix .journal). Both survive an interrupted run."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    use_rdb = prefer != "journal" and path.suffix != ".journal" and _rdb_available()
    if use_rdb:
        storage = optuna.storages.RDBStorage(
            f"sqlite:///{path.resolve()}", engine_kwargs={"connect_args": {"timeout": 60}})
        return storage, path, "sqlite"
    jpath = path if path.suffix == ".journal" else path.with_suffix(".journal")
    try:
        from optuna.storages.journal import JournalFileBackend as _Backend
    except ImportError:  # optuna < 4
        from optuna.storages import JournalFileStorage as _Backend  # type: ignore[no-redef]
    return optuna.storages.JournalStorage(_Backend(str(jpath))), jpath, "journal"


# The kernel each tuned launch enters (bole_cli/kernels/<module>.py): the sources of it and of
# every kernels module it imports, transitively, fingerprint its studies, so a change to any
# of them starts new studies and trial timings of an older kernel are never reused.
KERNEL_MODULES = {"tree_verify": "tree_verify", "tree_commit_replay": "tree_commit_replay", "tree_commit": "tree_commit",
                  "tree_conv": "tree_conv"}
_KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"


@functools.lru_cache(maxsize=None)
def kernel_sources(kernel: str) -> tuple[str, ...]:
    """The file names of bole_cli/kernels/ that `kernel`'s module imports, itself included
    (read with ast: no torch/triton import)."""
    seen: set[str] = set()
    todo = [KERNEL_MODULES[kernel]]
    while todo:
        name = todo.pop()
        if name in seen or not (_KERNELS_DIR / f"{name}.py").is_file():
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((_KERNELS_DIR / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("bole_cli.kernels."):
                    todo.append(node.module.split(".")[2])
                elif node.module == "bole_cli.kernels":
                    todo.extend(alias.name for alias in node.names)
    return tuple(sorted(f"{name}.py" for name in seen))


@functools.lru_cache(maxsize=None)
def kernel_fingerprint(kernel: str) -> str:
    """8 hex digits of the kernel's source text (`kernel_sources`)."""
    digest = hashlib.sha1()
    for name in kernel_sources(kernel):
        digest.update((_KERNELS_DIR / name).read_bytes())
    return digest.hexdigest()[:8]


def study_name(device_name: str, triton_version: str, bucket: Bucket, space: Mapping[str, list]) -> str:
    return (f"bole/{STUDY_VERSION}/{' '.join(device_name.split())}/triton-{triton_version}/"
            f"{bucket.key}/{space_fingerprint(bucket.kernel, space)}/src-{kernel_fingerprint(bucket.kernel)}")


def make_pruner(optuna, ratio: float):
    """Prunes a trial whose reported quick timing exceeds `ratio` x the best full timing
    among the study's completed trials; never the default (user attr "default")."""
    from optuna.trial import TrialState

    class SlowPruner(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            if trial.user_attrs.get("default"):
                return False
            step = trial.last_step
            if step is None:
                return False
            value = trial.intermediate_values[step]
            done = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.value is not None]
            return bool(done) and value > ratio * min(done)

    return SlowPruner()


def make_sampler(optuna, settings: TuneSettings, space: Mapping[str, list]):
    if settings.sampler == "grid":
        return optuna.samplers.GridSampler({k: list(v) for k, v in space.items()}, seed=settings.seed)
    if settings.sampler == "tpe":
        startup = max(3, min(10, settings.trials // 3))
        return optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=startup, multivariate=True)
    raise BoleError(f"unknown sampler {settings.sampler!r}")


_COUNTED = ("timed", "slow", "rejected", "skipped")


def _counts(trials) -> dict:
    out = {k: 0 for k in ("timed", "slow", "rejected", "skipped", "cached")}
    for t in trials:
        o = t.user_attrs.get("outcome")
        if o in out:
            out[o] += 1
    return out


class _Objective:
    def __init__(self, optuna, study, bucket: Bucket, evaluator: Evaluator, space, settings: TuneSettings):
        self.optuna, self.study, self.bucket, self.ev = optuna, study, bucket, evaluator
        self.space, self.settings = space, settings

    def _prior(self, cfg: dict, number: int):
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if t.number != number and t.params == cfg and t.user_attrs.get("outcome") in _COUNTED:
                return t
        return None

    def __call__(self, trial) -> float:
        from optuna.trial import TrialState

        cfg = {k: trial.suggest_categorical(k, list(v)) for k, v in self.space.items()}
        prior = self._prior(cfg, trial.number)
        if prior is not None:
            trial.set_user_attr("outcome", "cached")
            if prior.state == TrialState.COMPLETE:
                return float(prior.value)
            trial.set_user_attr("reason", prior.user_attrs.get("reason", ""))
            raise self.optuna.TrialPruned(prior.user_attrs.get("reason", "pruned before"))
        verdict = self.ev.check(self.bucket, dict(cfg))
        if verdict.error is not None and math.isfinite(verdict.error):
            trial.set_user_attr("check_error", verdict.error)
        if not verdict.ok:
            trial.set_user_attr("outcome", verdict.outcome)
            trial.set_user_attr("reason", verdict.reason)
            raise self.optuna.TrialPruned(f"{verdict.outcome}: {verdict.reason}")
        quick = float(self.ev.time(self.bucket, dict(cfg), self.settings.quick_ms))
        trial.set_user_attr("quick_us", quick)
        trial.report(quick, 0)
        if trial.should_prune():
            trial.set_user_attr("outcome", "slow")
            trial.set_user_attr("reason", f"quick timing {quick:.1f} us > {self.settings.slow_ratio:g}x the best")
            raise self.optuna.TrialPruned("slow")
        full = float(self.ev.time(self.bucket, dict(cfg), self.settings.full_ms))
        trial.set_user_attr("outcome", "timed")
        return full


def _fail_stale(study) -> None:
    """Trials left RUNNING by an interrupted process are marked FAIL (a tuning run owns its
    studies), so they neither block the budget count nor hide the default."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        with contextlib.suppress(Exception):
            study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)


def confirm(evaluator: Evaluator, bucket: Bucket, best: dict, default: dict, settings: TuneSettings
            ) -> tuple[float, float]:
    """(best us, default us): medians of alternating full timings (same clocks, same L2)."""
    d, b = [], []
    for _ in range(max(settings.confirm_rounds, 1)):
        d.append(float(evaluator.time(bucket, dict(default), settings.full_ms)))
        if best != default:
            b.append(float(evaluator.time(bucket, dict(best), settings.full_ms)))
    dm = statistics.median(d)
    return (statistics.median(b) if b else dm), dm


def tune_bucket(optuna, storage, bucket: Bucket, evaluator: Evaluator, settings: TuneSettings, *,
                fresh: bool = False, hints: Sequence[dict] = (), deadline: Optional[float] = None,
                on_trial: Optional[Callable[[Bucket, dict], None]] = None,
                models: Sequence[str] = ()) -> BucketResult:
    """Search one bucket; returns what should be stored for it.

    hints: configs worth trying early (the entry the tables hold for this bucket, winners
    of neighbouring buckets), enqueued after the default in a new study. deadline:
    time.monotonic() value after which no new trial starts (the default is always
    evaluated). on_trial(bucket, info) after every trial.
    """
    from optuna.trial import TrialState

    default = {k: int(v) for k, v in evaluator.default_config(bucket).items()}
    space = search_space(bucket.kernel, bucket.dims, include=default)
    name = study_name(evaluator.device_name, evaluator.triton_version, bucket, space)
    if fresh:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=name, storage=storage)
    sampler = make_sampler(optuna, settings, space)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="minimize",
                                pruner=make_pruner(optuna, settings.slow_ratio), load_if_exists=True)
    _fail_stale(study)
    trials = study.get_trials(deepcopy=False)
    have_default = any(t.user_attrs.get("default") and t.state in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                    TrialState.WAITING) for t in trials)
    if not have_default:
        study.enqueue_trial(default, user_attrs={"default": True})
        queued = [default]
        for h in hints:
            h = {k: int(h[k]) for k in space if k in h}
            if len(h) == len(space) and all(h[k] in space[k] for k in h) and h not in queued:
                study.enqueue_trial(h, user_attrs={"hint": True})
                queued.append(h)

    objective = _Objective(optuna, study, bucket, evaluator, space, settings)
    cap = settings.trials * settings.attempts_factor + 8
    attempts = 0
    cut_short = False
    evaluator.prepare(bucket)
    try:
        while True:
            trials = study.get_trials(deepcopy=False)
            counted = sum(1 for t in trials if t.user_attrs.get("outcome") in _COUNTED)
            default_done = any(t.user_attrs.get("default") and t.user_attrs.get("outcome") for t in trials)
            waiting = any(t.state == TrialState.WAITING for t in trials)
            if default_done and counted >= settings.trials:
                break
            if attempts >= cap:
                break
            if default_done and deadline is not None and time.monotonic() > deadline:
                cut_short = True
                break
            if settings.sampler == "grid" and not waiting and sampler.is_exhausted(study):
                break
            study.optimize(objective, n_trials=1, catch=())
            attempts += 1
            if on_trial is not None:
                last = study.get_trials(deepcopy=False)[-1]
                on_trial(bucket, {"number": last.number, "state": last.state.name,
                                  "outcome": last.user_attrs.get("outcome"), "value": last.value,
                                  "params": dict(last.params), "counted": last.user_attrs.get("outcome") in _COUNTED})

        trials = study.get_trials(deepcopy=False)
        counts = _counts(trials)
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        dtrial = next((t for t in trials if t.params == default and t.user_attrs.get("outcome") in _COUNTED), None)
        result = BucketResult(bucket, None, None, default, None, True, counts, models=list(models),
                              cut_short=cut_short)
        if dtrial is None or dtrial.state != TrialState.COMPLETE:
            why = dtrial.user_attrs.get("reason", "not evaluated") if dtrial is not None else "not evaluated"
            result.failed = f"the built-in config failed its check ({why})"
            return result
        best = min(done, key=lambda t: t.value)
        result.best_trial_config, result.best_trial_us = dict(best.params), float(best.value)
        best_us, default_us = confirm(evaluator, bucket, dict(best.params), default, settings)
        result.default_us = default_us
        if best.params != default and best_us < default_us * (1.0 - settings.margin):
            result.config, result.us, result.is_default = dict(best.params), best_us, False
        else:
            result.config, result.us, result.is_default = dict(default), default_us, True
        return result
    finally:
        evaluator.release()


def run_tuning(optuna, storage, buckets: Sequence[Bucket], evaluator: Evaluator, settings: TuneSettings, *,
               owners: Optional[Mapping] = None, fresh: bool = False, budget_s: Optional[float] = None,
               on_trial=None, on_result: Optional[Callable[[BucketResult], None]] = None,
               incumbents: Optional[Mapping[str, dict]] = None) -> list[BucketResult]:
    """Tune every bucket in order. With budget_s, each bucket gets an equal share of the
    time left (so a budget spreads over all buckets rather than starving the last).
    incumbents: bucket key -> the config the tables in force hold now; tried right after the
    default, so a retune (e.g. after a kernel change, which starts new studies) does not lose a
    good entry just because the sampler never drew it."""
    results: list[BucketResult] = []
    winners: dict[tuple, list[dict]] = {}
    start = time.monotonic()
    for i, bucket in enumerate(buckets):
        deadline = None
        if budget_s is not None:
            left = budget_s - (time.monotonic() - start)
            deadline = time.monotonic() + max(left, 0.0) / (len(buckets) - i)
        group = (bucket.kernel, bucket.model)
        incumbent = (incumbents or {}).get(bucket.key)
        hints = ([incumbent] if incumbent else []) + winners.get(group, [])[-2:]
        res = tune_bucket(optuna, storage, bucket, evaluator, settings, fresh=fresh,
                          hints=hints, deadline=deadline, on_trial=on_trial,
                          models=(owners or {}).get(group, []))
        if res.best_trial_config and res.best_trial_config not in winners.setdefault(group, []):
            winners[group].append(res.best_trial_config)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


# ---- the default config and a planning estimate -----------------------------------------

@contextlib.contextmanager
def builtin_configs():
    """No tuned-table resolver while this block runs (the tuner compares against the
    built-in configs and must not be steered by an older table)."""
    from bole_cli.kernels import tuned_tables

    saved = tuned_tables.get_resolver()
    tuned_tables.set_resolver(None)
    try:
        yield
    finally:
        tuned_tables.set_resolver(saved)


def builtin_default(bucket: Bucket) -> dict:
    """The built-in config for the bucket's shape (launch_config without a resolver),
    restricted to the keys the tuner searches (and the kernel takes)."""
    from bole_cli.kernels.configs import launch_config
    from bole_cli.kernels.tuned_tables import TUNED_KEYS
    from bole_cli.kernels.verify_path import is_tile_launch

    shape = bucket.launch_shape()
    with builtin_configs():
        cfg = launch_config(bucket.kernel, shape)
    keys = TUNED_KEYS[bucket.kernel]
    if bucket.kernel == "tree_verify":  # only the knobs of the kernel this bucket launches
        keys = tuple(k for k in keys if k != ("BC" if is_tile_launch(shape) else "VSPLIT"))
    return {k: int(cfg[k]) for k in keys if k in cfg}


# Seconds per timed trial / per compile / per bucket: orders of magnitude for an H200 host
# (refine them from a run's JSON "seconds" against its "estimate_s").
EST_TRIAL_S = {"tree_verify": 0.12, "tree_commit_replay": 0.10, "tree_commit": 0.10, "tree_conv": 0.10}
EST_COMPILE_S = {"tree_verify": 1.5, "tree_commit_replay": 0.6, "tree_commit": 0.6, "tree_conv": 0.5}
EST_BUCKET_S = 0.6  # inputs, reference case, confirmation timings


def estimate_seconds(buckets: Sequence[Bucket], trials: int, sampler: str = "tpe") -> float:
    """Rough wall time: timed trials, per-bucket set-up, and a compile per distinct config.

    Compiles are shared by the buckets of one (kernel, model shape): the samplers are
    seeded alike in every bucket, so their first proposals coincide (a grid walks the same
    points everywhere); about 60% of TPE's later proposals are taken as new. The commits
    compile again per batch class (1, a multiple of 16, other: Triton specialises n_req).
    """
    from bole_cli.kernels.buckets import LAYERED

    total = 0.0
    groups: dict[tuple, list[Bucket]] = {}
    for b in buckets:
        total += trials * EST_TRIAL_S[b.kernel] + EST_BUCKET_S
        groups.setdefault((b.kernel, b.model), []).append(b)
    for (kernel, model), members in groups.items():
        dims = members[0].dims
        size = 1
        for v in search_space(kernel, dims).values():
            size *= len(v)
        if sampler == "grid":
            distinct = min(size, trials)
        else:
            startup = max(3, min(10, trials // 3))
            distinct = min(size, 1 + startup + len(members) * max(trials - startup - 1, 0) * 0.6)
        if kernel in LAYERED:
            distinct *= len({1 if b.batch == 1 else (16 if b.batch % 16 == 0 else 0) for b in members})
        total += distinct * EST_COMPILE_S[kernel]
    return total
