"""The calibration sweep: time every (batch, kv_len) configuration and grid point through a
`StepTimer`, then turn the curves into profile entries (B_ver, N*).

The same driver runs the GPU runtime (measured profiles) and the roofline cost model
(estimated profiles); only the StepTimer and the timing policy differ.
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from bole_cli import __version__
from bole_cli.calibrate.acceptance import AcceptanceModel
from bole_cli.calibrate.decision import BucketCosts, chain_points
from bole_cli.calibrate.selection import select_b_ver
from bole_cli.errors import BoleError
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.profiles.schema import decode_failure, failure_cell


@runtime_checkable
class StepTimer(Protocol):
    """What the sweep needs from a model runtime (bole_cli.runtime implements it on CUDA).

    Each call times ONE step of the target model on the device and returns seconds
    (CUDA events around a CUDA-graph replay; an implementation may average an inner loop
    of replays to beat the events' resolution). The driver does warm-up, repeats, the
    median and the noise guard. Shapes may be prepared lazily on first use: warm-up
    calls absorb that.

    - time_decode(batch, kv_len): one decode step, `batch` requests of one new token
      each over `kv_len` cached tokens (GDN state read and updated in place).
    - time_verify(batch, kv_len, n_tree_tokens): one tree-verify forward over
      `n_tree_tokens` tokens spread over the batch's trees (each request's root, the
      last verified token, included; n_tree_tokens >= batch), each request over
      `kv_len` cached tokens, plus the state commit (Eq. 10) of one accepted path.

    The tree shape is the runtime's choice (for example the best n nodes of a depth-8,
    top-4 draft tree per request); say which in info(). A call may raise (out of memory):
    the sweep records it and skips the rest of that configuration.

    Optional: `device_name` (str) and `info()` (dict, e.g. {"sampled_layers": [...],
    "tree": "..."}), both recorded in the profile's provenance; and the costs the decision
    adds to the verify (docs/design.md §8), timed once per configuration when present:
    - time_draft_level(batch, kv_len, rows): one level of the drafter over `rows` rows per
      request (level 1 of a tree or chain has 1, further tree levels top-k);
    - time_sample(batch, tokens): the target's argmax over `tokens` rows of logits and
      the sampled tokens' trip to the host.
    """

    def time_decode(self, batch: int, kv_len: int) -> float: ...

    def time_verify(self, batch: int, kv_len: int, n_tree_tokens: int) -> float: ...


@dataclass(frozen=True)
class Timing:
    warmup: int = 3  # untimed calls before each point
    repeats: int = 10  # timed calls per round; the point is their median
    spread_tol: float = 0.10  # (q3 - q1) / median above this -> measure again
    max_rounds: int = 3  # rounds before a point is kept and flagged noisy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EXACT = Timing(warmup=0, repeats=1, spread_tol=float("inf"), max_rounds=1)  # cost model
#: Failed points shown as warnings; the rest are counted (the profile keeps them all).
MAX_FAILURE_WARNINGS = 3


@dataclass(frozen=True)
class Point:
    seconds: float  # median
    spread: float  # (q3 - q1) / median of the kept round
    noisy: bool


def spread_of(samples: Sequence[float]) -> float:
    if len(samples) < 4:
        return 0.0 if len(set(samples)) <= 1 else (max(samples) - min(samples)) / statistics.median(samples)
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def measure(fn: Callable[[], float], timing: Timing) -> Point:
    """Warm up, then rounds of `repeats` timed calls until one round's spread is within
    tolerance; keep the median of the tightest round (flagged noisy if none was)."""
    for _ in range(timing.warmup):
        fn()
    best: Optional[Point] = None
    for _ in range(max(1, timing.max_rounds)):
        samples = [float(fn()) for _ in range(max(1, timing.repeats))]
        point = Point(statistics.median(samples), spread_of(samples), False)
        if best is None or point.spread < best.spread:
            best = point
        if point.spread <= timing.spread_tol:
            return point
    assert best is not None
    return Point(best.seconds, best.spread, True)


@dataclass
class ConfigCurve:
    batch: int
    kv_len: int
    t_dec: float
    n: list[int] = field(default_factory=list)
    t_ver: list[float] = field(default_factory=list)
    noisy: list[int] = field(default_factory=list)  # grid points (0 = the decode step)
    draft_level: list[float] = field(default_factory=list)  # rows per request 1..K
    sample: Optional[tuple[float, float]] = None  # (fixed, per token) seconds
    #: summarise()'s result, made as the sweep goes (run_sweep with eps), so a Ctrl-C
    #: leaves at most one configuration to summarise before the profile is written
    summary: Optional[tuple[dict, bool]] = field(default=None, repr=False, compare=False)


@dataclass
class SweepResult:
    curves: list[ConfigCurve]
    interrupted: bool = False
    failures: list[str] = field(default_factory=list)  # points that raised (e.g. out of memory)


@dataclass(frozen=True)
class Extras:
    """What the sweep times beyond the curve, for the decision (docs/design.md §8)."""

    per_request_cap: int = MAX_TREE_NODES  # no request verifies more tokens than this
    chain_depth: int = 0  # also time the chains' verify sizes batch * (d + 1), d <= this
    draft_rows: int = 0  # time drafter levels of 1..draft_rows rows per request (0: none)


def feasible_points(grid: Sequence[int], batch: int, extras: Extras = Extras()) -> list[int]:
    """Points a batch verifies: grid points from its roots (one token per request) up to
    `per_request_cap` tokens per request, and the chains' sizes."""
    points = {n for n in grid if batch <= n <= batch * extras.per_request_cap}
    points.update(chain_points(batch, extras.chain_depth) if extras.chain_depth else ())
    return sorted(points)


def extra_steps(forward: Any, extras: Extras) -> int:
    """Timed steps per configuration beyond the curve: drafter levels and the sample line."""
    draft = extras.draft_rows if callable(getattr(forward, "time_draft_level", None)) else 0
    return draft + (2 if callable(getattr(forward, "time_sample", None)) else 0)


def sweep_steps(batches: Sequence[int], kv_lens: Sequence[int], grid: Sequence[int],
                extras: Extras = Extras(), forward: Any = None) -> int:
    per_config = extra_steps(forward, extras) if forward is not None else 0
    return len(kv_lens) * sum(1 + per_config + len(feasible_points(grid, b, extras))
                              for b in batches)


def _time_extras(forward: Any, curve: ConfigCurve, extras: Extras, timing: "Timing",
                 step: Callable[[str], None]) -> None:
    """The drafter's levels and the sample line of one configuration (when the StepTimer
    offers them); a failure leaves them out, and the decision then prices no speculation."""
    b, kv = curve.batch, curve.kv_len
    if callable(getattr(forward, "time_draft_level", None)):
        for rows in range(1, extras.draft_rows + 1):
            curve.draft_level.append(
                measure(lambda: forward.time_draft_level(b, kv, rows), timing).seconds)
            step(f"batch {b}, kv {kv}: draft level x{rows}")
    if callable(getattr(forward, "time_sample", None)):
        top = max(curve.n) if curve.n else b
        lo = measure(lambda: forward.time_sample(b, b), timing).seconds
        step(f"batch {b}, kv {kv}: sample")
        hi = measure(lambda: forward.time_sample(b, top), timing).seconds
        step(f"batch {b}, kv {kv}: sample")
        per_token = max(0.0, (hi - lo) / (top - b)) if top > b else 0.0
        curve.sample = (max(0.0, lo - per_token * b), per_token)


def _why(exc: BaseException) -> str:
    """A failed point's reason: Bole's own errors are worded already; others keep their type
    (OutOfMemoryError, RuntimeError) in front."""
    return str(exc) if isinstance(exc, BoleError) else f"{type(exc).__name__}: {exc}"


def run_sweep(forward: StepTimer, batches: Sequence[int], kv_lens: Sequence[int],
              grid: Sequence[int], timing: Timing = Timing(),
              on_step: Optional[Callable[[str], None]] = None,
              extras: Extras = Extras(), eps: Optional[float] = None,
              acceptance: Optional[AcceptanceModel] = None) -> SweepResult:
    """Time T_dec and T_ver(N) for every configuration (kv_len outer, batch inner).

    Ctrl-C (KeyboardInterrupt) stops the sweep and keeps what was measured: complete
    configurations, and the current one if its decode step and at least one verify point
    were measured. A point that raises (out of memory, say) ends its configuration there:
    the points before it are kept, the rest of its steps are skipped, and the error is
    listed in `failures`. `on_step(description)` is called after every timed point.
    With `eps`, each configuration is summarised (`summarise`, with `acceptance`) as soon
    as it is measured, so the profile of a cut sweep is written at once.
    """
    result = SweepResult(curves=[])
    step = on_step or (lambda _desc: None)
    current: Optional[ConfigCurve] = None
    try:
        for kv in kv_lens:
            for b in batches:
                current = None
                points = feasible_points(grid, b, extras)
                per_config = extra_steps(forward, extras)
                try:
                    dec = measure(lambda: forward.time_decode(b, kv), timing)
                except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                    result.failures.append(decode_failure(b, kv, _why(exc)))
                    for _ in range(1 + len(points) + per_config):
                        step(f"batch {b}, kv {kv}: skipped")
                    continue
                current = ConfigCurve(batch=b, kv_len=kv, t_dec=dec.seconds,
                                      noisy=[0] if dec.noisy else [])
                step(f"batch {b}, kv {kv}: decode")
                for i, n in enumerate(points):
                    try:
                        ver = measure(lambda: forward.time_verify(b, kv, n), timing)
                    except Exception as exc:  # noqa: BLE001
                        result.failures.append(
                            f"{failure_cell(b, kv)}, N {n}: {_why(exc)}")
                        for _ in points[i:]:
                            step(f"batch {b}, kv {kv}: skipped")
                        break
                    current.n.append(n)
                    current.t_ver.append(ver.seconds)
                    if ver.noisy:
                        current.noisy.append(n)
                    step(f"batch {b}, kv {kv}: verify {n}")
                done = [0]

                def counted(desc: str) -> None:
                    done[0] += 1
                    step(desc)

                if current.n:
                    try:
                        _time_extras(forward, current, extras, timing, counted)
                    except KeyboardInterrupt:
                        raise
                    except Exception as exc:  # noqa: BLE001
                        current.draft_level, current.sample = [], None
                        result.failures.append(f"{failure_cell(b, kv)}, drafter or sampling: "
                                               f"{_why(exc)}")
                    result.curves.append(current)
                for _ in range(per_config - done[0]):
                    step(f"batch {b}, kv {kv}: skipped")
                kept, current = current, None
                if eps is not None and kept.n:
                    kept.summary = summarise(kept, eps, acceptance)
    except KeyboardInterrupt:
        result.interrupted = True
        if current is not None and current.n:
            result.curves.append(current)
    return result


# ---- from curves to a profile -------------------------------------------------------------
def bucket_costs(curve: ConfigCurve) -> Optional[BucketCosts]:
    """The decision's inputs for one configuration (None without drafter or sample costs)."""
    if not curve.draft_level or curve.sample is None:
        return None
    return BucketCosts(curve.batch, curve.kv_len, curve.t_dec, list(curve.n), list(curve.t_ver),
                       list(curve.draft_level), curve.sample[0], curve.sample[1])


def summarise(curve: ConfigCurve, eps: float,
              acceptance: Optional[AcceptanceModel]) -> tuple[dict, bool]:
    """One profile config entry; also whether B_ver fell back (no point under threshold).

    With the drafter's and sampling's costs the entry carries the decision (how to
    speculate, docs/design.md §8); N* is then the best tree's budget under the same
    objective, and e_acc the expected tokens of the model's own beam tree per point."""
    from bole_cli.calibrate.decision import decide

    budget = select_b_ver(curve.n, curve.t_ver, curve.t_dec, eps)
    entry: dict[str, Any] = {
        "batch": curve.batch,
        "kv_len": curve.kv_len,
        "t_dec": curve.t_dec,
        "n": list(curve.n),
        "t_ver": list(curve.t_ver),
        "b_ver": budget.b_ver,
        "below_threshold": budget.below_threshold,
        "n_star": None,
    }
    costs = bucket_costs(curve)
    if costs is not None:
        entry["draft_level"] = list(curve.draft_level)
        entry["sample"] = {"fixed": curve.sample[0], "per_token": curve.sample[1]}
    if acceptance is not None:
        entry["e_acc"] = [acceptance.batch(n, curve.batch) for n in curve.n]
        if costs is not None:
            decision = decide(costs, acceptance)
            entry["decision"] = decision.to_dict()
            tree = decision.best.get("tree")
            entry["n_star"] = tree.budget if tree is not None else None
    if curve.noisy:
        entry["noisy"] = sorted(p for p in curve.noisy if p > 0)
        if 0 in curve.noisy:
            entry["t_dec_noisy"] = True
    return entry, budget.below_threshold


def _version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def build_profile(*, gpu_key: str, model_name: str, kind: str, sweep: SweepResult,
                  grid: Sequence[int], eps: float, acceptance: Optional[AcceptanceModel],
                  device_name: str, command: str = "", note: str = "",
                  extra_provenance: Optional[dict] = None) -> tuple[dict, list[str]]:
    """The profile mapping (schema in bole_cli.profiles.schema) and warnings to show.

    It carries no `kernels` section: write it with `write_profile`, which keeps the one a
    file already has."""
    from bole_cli.profiles.schema import PROFILE_VERSION

    warnings: list[str] = []
    configs = []
    fallbacks = 0
    for curve in sweep.curves:
        entry, fallback = curve.summary or summarise(curve, eps, acceptance)
        configs.append(entry)
        fallbacks += bool(fallback)
        if entry.get("noisy") or entry.get("t_dec_noisy"):
            warnings.append(f"batch {curve.batch}, kv {curve.kv_len}: noisy timings kept at "
                            f"{', '.join(map(str, entry.get('noisy', []))) or 'the decode step'}")
    if fallbacks:  # one line, not one a cell: the table marks each (!), the profile says which
        warnings.insert(0, f"{fallbacks} of {len(configs)} cells (!): no grid point within "
                           f"(1 + {eps:g}) x T_dec")
    provenance: dict[str, Any] = {
        "kind": kind,
        "partial": bool(sweep.interrupted),
        "note": note,
        "sampled_layers": None,
        "bole_version": __version__,
        "torch_version": _version("torch"),
        "triton_version": _version("triton"),
        "device_name": device_name,
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": command,
    }
    if sweep.failures:
        provenance["failures"] = list(sweep.failures)
        shown = sweep.failures[:MAX_FAILURE_WARNINGS]
        warnings += [f"failed: {f}" for f in shown]
        if len(sweep.failures) > len(shown):
            more = len(sweep.failures) - len(shown)
            warnings.append(f"... and {more} more failure{'s' if more > 1 else ''}: all in the "
                            "profile's provenance.failures")
    provenance.update(extra_provenance or {})
    profile: dict[str, Any] = {
        "bole_profile": PROFILE_VERSION,
        "gpu": gpu_key,
        "model": model_name,
        "dtype": "bf16",
        "provenance": provenance,
        "eps": eps,
        "grid": list(grid),
        "acceptance": acceptance.describe() if acceptance is not None else None,
        "configs": configs,
    }
    if sweep.interrupted:
        warnings.append("interrupted: the profile holds the configurations measured so far "
                        "and is marked partial")
    return profile, warnings


def write_profile(path: "str | os.PathLike[str]", profile: dict) -> dict:
    """Write a calibration result, keeping the other sections (kernels) of an existing
    profile for the same gpu and model; a new file starts with an empty kernels section."""
    from bole_cli.profiles.io import update_profile

    return update_profile(path, profile, create={"kernels": {}})
