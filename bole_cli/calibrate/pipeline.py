"""`bole calibrate` in order: check the request, pick measuring or the roofline estimate,
sweep, build and write the profile, plot it (docs/design.md §5, §8).

Two steps so the caller can speak between them: `plan_calibration` checks everything that
can fail cheaply (options, the --out file, the device) and decides measured or estimated;
`run_calibration` builds the `StepTimer`, announces the path taken, sweeps and writes. The budget decision
is bole_cli.calibrate.selection's, the profile's contents bole_cli.calibrate.sweep's, the
summary table's rows bole_cli.calibrate.summary's: each can change alone. Nothing heavy is
imported at module level; the measured path imports bole_cli.runtime when it is taken.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Sequence

from bole_cli.calibrate.acceptance import DEFAULT_PRESET
from bole_cli.calibrate.defaults import (DEFAULT_BATCHES, DEFAULT_EPS, DEFAULT_GRID, DEFAULT_KV_LENS,
                                        DEFAULT_REPEATS, DEFAULT_WARMUP, ESTIMATE_PROGRESS_STEPS, MAX_EPS)
from bole_cli.errors import BoleError, InputError
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.parsing import check_draft_vocab, check_int
from bole_cli.paths import partial_path

#: progress(total steps) -> a context whose value is called with each step's description.
Progress = Callable[[int], ContextManager[Callable[[str], None]]]


def int_list_text(values: Sequence[int]) -> str:
    """[1, 2, 4] -> '1,2,4', the form --batch/--kv/--grid take."""
    return ",".join(map(str, values))


def check_out_path(path: Path, gpu_key: str, model_name: str, *, what: str = "--out",
                   plot: bool = False, measured: bool = True) -> None:
    """Refuse an --out that cannot take this profile (or its plot) before a sweep is spent
    on it: a folder, the plot's name, a name that says another format, a shipped profile
    (the repository's records: a user's run goes to the user's space, and a shipped profile
    is replaced by hand after review, docs/design.md §5), an unwritable place, another
    model's profile, and for an estimate (not `measured`) a measured profile, which
    `bole serve` would otherwise stop using without a word."""
    from bole_cli.console import check_name_lengths, check_writable
    from bole_cli.profiles.io import PROFILE_SUFFIXES

    check_name_lengths(path, what)
    if path.is_dir():
        raise InputError(f"{what}: {path} is a directory; give a .yaml file path")
    if path.suffix.lower() == ".png":
        raise InputError(f"{what}: {path} is the plot's name; give a .yaml file path")
    if path.suffix.lower() not in PROFILE_SUFFIXES:
        raise InputError(f"{what}: {path}: a profile is YAML; give a .yaml or .yml file path")
    check_writable(path, what)  # also refuses the repository's records (shipped profiles)
    partial = partial_path(path)  # where a cut sweep goes when this file holds a profile
    check_name_lengths(partial, what)
    if path.exists() and partial.exists():
        _same_profile(partial, gpu_key, model_name, what, ", where a cut sweep would go,")
    if plot:
        from bole_cli.calibrate.plot import plot_path_for

        check_writable(plot_path_for(path), f"{what} (its plot)")
    if path.exists():
        old = _same_profile(path, gpu_key, model_name, what)
        if not measured and old["provenance"]["kind"] == "measured":
            raise InputError(f"{what}: {path} holds a profile measured on the GPU, which an estimate "
                             "would replace; give another --out (or move that file)")


def _same_profile(path: Path, gpu_key: str, model_name: str, what: str, where: str = "") -> dict:
    """The profile at `path`, which a write would replace: InputError unless it is readable
    and of this gpu and model."""
    from bole_cli.profiles import load_profile

    try:
        old = load_profile(path)
    except InputError as exc:
        raise InputError(f"{what}: {exc}; it is not overwritten") from None
    if (old.get("gpu"), old.get("model")) != (gpu_key, model_name):
        raise InputError(f"{what}: {path}{where} holds {old.get('model')} on {old.get('gpu')}, "
                         f"not {model_name} on {gpu_key}")
    return old


def runtime_forward(model: Any, detected: Any, layers_sample: Optional[int],
                    draft_vocab: Optional[int] = None) -> Any:
    """The runtime's StepTimer on the present device; BoleError when it is unavailable."""
    try:
        import torch

        from bole_cli.runtime.timer import HybridForwardTimer
    except ImportError as exc:
        raise BoleError(
            f"measuring needs bole_cli.runtime (the embedded Qwen3.5 forward), which cannot "
            f"be imported ({exc}); use --estimate for the roofline model") from None
    from bole_cli.calibrate.measured import MeasuredForward

    timer = HybridForwardTimer(model, f"cuda:{detected.index}", torch.bfloat16,
                               layers_sample=layers_sample, serving_step=True)
    return MeasuredForward(timer, draft_vocab=draft_vocab)


def device_for(gpu_spec: Any, measure: bool, estimate: bool) -> tuple[Any, str]:
    """(the detected device to measure on, or None; why the estimate was chosen)."""
    if estimate:
        return None, "--estimate"
    from bole_cli.catalog.hardware import detect_gpu

    detected = detect_gpu()
    if detected is not None and detected.spec is not None and detected.spec.key == gpu_spec.key:
        return detected, ""
    reason = (f"no {gpu_spec.key.upper()} present; "
              + (f"found {detected.name}" if detected else "no CUDA device"))
    if measure:  # an option this machine cannot honour, as --device cuda without one (exit 2)
        raise InputError(f"--measure: {reason} (leave it out for the estimate)")
    return None, reason


def reproduce_command(gpu: str, model: str, batches, kvs, grid, eps: float, acceptance: str,
                      mode: str, draft_vocab: Optional[int] = None) -> str:
    """The `bole calibrate` line that makes this profile again (defaults left out), quoted
    to paste back, --eps at full precision."""
    from bole_cli.console import shell_join

    words = ["bole", "calibrate", "--gpu", gpu, "--model", model]
    if tuple(batches) != DEFAULT_BATCHES:
        words += ["--batch", int_list_text(batches)]
    if tuple(kvs) != DEFAULT_KV_LENS:
        words += ["--kv", int_list_text(kvs)]
    if tuple(grid) != DEFAULT_GRID:
        words += ["--grid", int_list_text(grid)]
    if eps != DEFAULT_EPS:
        words += ["--eps", repr(float(eps))]
    if acceptance != DEFAULT_PRESET:
        words += ["--acceptance", acceptance]
    if draft_vocab:
        words += ["--draft-vocab", str(draft_vocab)]
    if mode:
        words.append(mode)
    return shell_join(words)


@dataclass
class CalibrationPlan:
    """A checked request; `label` says measured (on `detected`) or estimated."""

    gpu_spec: Any
    model_spec: Any
    acceptance: Any
    batches: list[int]
    kvs: list[int]
    points: list[int]
    eps: float
    path: Path
    detected: Any  # the device measured on, None when estimating
    timing: Any
    layers_sample: Optional[int]
    label: str
    command: str
    note: str
    #: the drafter's hot-token vocabulary (SGLang's --speculative-token-map); None: the full one
    draft_vocab: Optional[int] = None
    #: --model as given: what `bole serve --model` takes for a model outside the catalogue
    model_given: str = ""

    @property
    def measured(self) -> bool:
        return self.detected is not None

    @property
    def serve_model(self) -> str:
        """The --model of the `bole serve` command that serves this profile."""
        if self.model_spec.source == "catalogue" or not self.model_given:
            return self.model_spec.short_name
        return self.model_given


@dataclass
class CalibrationResult:
    path: Path
    plot_path: Optional[Path]
    label: str
    warnings: list[str]
    profile: dict
    interrupted: bool
    #: which profile `bole serve` takes for this GPU and model, when it is not this one
    served: Optional[str] = None
    #: then the command that serves this one instead (argv)
    serve_command: Optional[list[str]] = None


def served_instead(plan: "CalibrationPlan") -> tuple[Optional[str], Optional[list[str]]]:
    """When `bole serve` would take another profile than the one just written (a measured
    profile of the same GPU and model, shipped or in the cache, wins over an estimate:
    bole_cli/profiles/lookup.py, so an ESTIMATED table is not what is served), or takes it
    only with SGLang's token map (a hot-token head's, plan.draft_vocab): one line saying so,
    and the command that serves this one; else (None, None)."""
    from bole_cli.profiles import find_profile, load_profile

    hot = plan.draft_vocab
    found = find_profile(plan.gpu_spec, plan.model_spec, draft_vocab=hot)
    serve = ["bole", "serve", "--model", plan.serve_model]
    with_map = ["--", "--speculative-token-map", "FILE"] if hot else []
    if found is not None and found.resolve() == plan.path.resolve():
        if not hot:
            return None, None
        return (f"`bole serve` takes this profile when SGLang is given a map of {hot:,} hot "
                "tokens (FILE):", serve + with_map)
    if found is None and not hot:
        return None, None
    what = "estimate" if not plan.measured else "profile"
    if found is None:
        return (f"`bole serve` finds no profile of this head by itself. To use this {what}:",
                serve + ["--profile", str(plan.path)] + with_map)
    kind = load_profile(found)["provenance"]["kind"]
    return (f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} profile for {plan.model_spec.name} on "
            f"{plan.gpu_spec.name} is in "
            f"{found}; `bole serve` uses that one, not this {what}. To use this one:",
            serve + ["--profile", str(plan.path)] + with_map)


def plan_calibration(*, gpu: str, model: str, batches: list[int], kvs: list[int],
                     points: list[int], eps: float, out: Optional[Path] = None,
                     measure: bool = False, estimate: bool = False,
                     acceptance: str = DEFAULT_PRESET, draft_vocab: Optional[int] = None,
                     repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                     layers_sample: Optional[int] = None, note: str = "",
                     plot: bool = False) -> CalibrationPlan:
    """Check the request and choose the StepTimer: the runtime on the named GPU when it is
    present (or demanded with `measure`), else the roofline model."""
    from bole_cli.calibrate.acceptance import load_acceptance
    from bole_cli.calibrate.sweep import EXACT, Timing
    from bole_cli.catalog.hardware import resolve_gpu
    from bole_cli.catalog.models import resolve_model
    from bole_cli.paths import default_named
    from bole_cli.profiles.io import profile_path, user_profiles_dir

    if not (math.isfinite(eps) and 0 < eps <= MAX_EPS):
        raise InputError(f"--eps: must be a number above 0 and at most {MAX_EPS:g}, "
                         f"got {eps:g}")
    if measure and estimate:
        raise InputError("--measure and --estimate exclude each other")
    check_int(repeats, "--repeats")
    check_int(warmup, "--warmup", minimum=0)
    check_int(layers_sample, "--layers-sample")
    measuring_options = [flag for flag, given in (("--repeats", repeats != DEFAULT_REPEATS),
                                                  ("--warmup", warmup != DEFAULT_WARMUP),
                                                  ("--layers-sample", layers_sample is not None)) if given]
    if estimate and measuring_options:  # options of the measured path, with --estimate: a contradiction
        raise InputError(f"{measuring_options[0]}: only a measurement uses it; drop it with --estimate")
    gpu_spec = resolve_gpu(gpu)
    model_spec = resolve_model(model)
    acc = load_acceptance(acceptance)
    draft_vocab = check_draft_vocab(draft_vocab, model_spec.vocab, acc.top_k)
    unreachable = [b for b in batches if b > max(points)]
    if unreachable and tuple(points) == DEFAULT_GRID:  # the user gave no --grid: blame --batch
        raise InputError(f"--batch: {unreachable[0]} is above the default grid's largest N "
                         f"({max(points)} tree tokens, one a request at least); add --grid "
                         f"with points up to {unreachable[0]} or more")
    if unreachable:
        raise InputError(f"--grid: no point reaches batch {unreachable[0]} (largest N is {max(points)}); "
                         "N counts tree tokens of the whole batch, at least one per request")
    cap = max(batches) * MAX_TREE_NODES  # the default grid's big points serve big batches only
    never = [n for n in points if n > cap]
    if never and tuple(points) != DEFAULT_GRID:
        raise InputError(f"--grid: {never[0]} would never be timed: batch {max(batches)}, the largest, "
                         f"verifies at most {cap} tree tokens ({MAX_TREE_NODES} a request)")
    detected, reason = device_for(gpu_spec, measure, estimate)
    if detected is None and measuring_options:  # it would be ignored without a word
        raise InputError(f"{measuring_options[0]}: only a measurement uses it, and this run is the "
                         f"estimate ({reason}); drop it, or run on that GPU")
    if detected is None:
        _check_fits_at_all(model, model_spec, gpu_spec, min(batches), min(kvs), points, acc)
    path = (Path(out) if out is not None
            else profile_path(user_profiles_dir(), gpu_spec.key, model_spec.name, draft_vocab))
    check_out_path(path, gpu_spec.key, model_spec.name, plot=plot, measured=detected is not None,
                   what="--out" if out is not None else
                   default_named("profile"))
    if detected is not None:
        timing = Timing(warmup=warmup, repeats=repeats)
        label = f"MEASURED on {detected.name}"
    else:
        timing = EXACT
        label = f"ESTIMATED (roofline model, {reason})"
    command = reproduce_command(gpu, model, batches, kvs, points, eps, acceptance,
                                "--measure" if measure else "--estimate" if estimate else "", draft_vocab)
    return CalibrationPlan(gpu_spec=gpu_spec, model_spec=model_spec, acceptance=acc,
                           batches=batches, kvs=kvs, points=points, eps=eps, path=path,
                           detected=detected, timing=timing, layers_sample=layers_sample,
                           label=label, command=command, note=note, draft_vocab=draft_vocab,
                           model_given=model)


def _check_fits_at_all(model: str, model_spec: Any, gpu_spec: Any, batch: int, kv_len: int,
                       points: Sequence[int], acceptance: Any) -> None:
    """Refuse an estimate none of whose cells fits the GPU's memory: the smallest cell's
    smallest verify (the draft head beside it) does not fit, so no cell would have an entry.
    The weights alone (a model served across several GPUs) blame --model; else --batch where
    the parts that grow with the batch alone (states, activations) do not fit beside the
    weights, else --batch/--kv; at batch 1 only --kv can still shrink the cell. Cells that
    do not fit among ones that do are the sweep's to report (RooflineForward's
    check_memory)."""
    from bole_cli.calibrate.costmodel import RooflineForward
    from bole_cli.calibrate.sweep import feasible_points
    from bole_cli.footprint import largest_parts, need_and_available

    roof = RooflineForward(model_spec, gpu_spec)
    n = min(feasible_points(points, batch, sweep_extras(acceptance)), default=0)
    need = roof.memory(batch, kv_len, n)
    has = gpu_spec.memory_bytes
    if need["total"] <= has:
        return
    fixed = need["weights"] + need.get("draft_head", 0) + need["workspace"]
    by_context = need["kv_cache"] + need.get("draft_kv", 0) + need.get("attention_bias", 0)
    if fixed > has:
        fixed_s, available = need_and_available(fixed, has)
        raise InputError(f"--model {model}: its weights need {fixed_s} with the draft head; one "
                         f"{gpu_spec.name} has {available}, and Bole calibrates one GPU")
    total, available = need_and_available(need["total"], has)
    option = ("--kv" if batch == 1 else "--batch" if need["total"] - by_context > has
              else "--batch/--kv")
    tokens = f"{kv_len:,} cached token{'s' if kv_len != 1 else ''}"
    raise InputError(f"{option}: the smallest cell, batch {batch} over {tokens}, needs {total} to verify "
                     f"{n} tree tokens ({largest_parts(need)}); one {gpu_spec.name} has {available}")


def make_forward(plan: CalibrationPlan) -> Any:
    """The runtime on the detected device when measuring, else the roofline model."""
    if plan.measured:
        return runtime_forward(plan.model_spec, plan.detected, plan.layers_sample, plan.draft_vocab)
    from bole_cli.calibrate.costmodel import RooflineForward

    return RooflineForward(plan.model_spec, plan.gpu_spec, draft_vocab=plan.draft_vocab, check_memory=True)


def _provenance_extra(plan: CalibrationPlan, forward: Any) -> dict[str, Any]:
    """Timing settings (measured) and what the StepTimer says of itself (`info()`)."""
    extra: dict[str, Any] = {}
    if plan.measured:
        extra["timing"] = plan.timing.to_dict()
    info = getattr(forward, "info", None)
    if callable(info):
        details = dict(info())
        if "sampled_layers" in details:
            extra["sampled_layers"] = details.pop("sampled_layers")
        extra["cost_model" if not plan.measured else "runtime"] = details
    return extra


def sweep_extras(acceptance: Any) -> Any:
    """What the sweep times for the decision: points up to the largest tree the acceptance
    model's drafter proposes per request, the chains' verify sizes, and drafter levels of
    1..top-k rows per request (docs/design.md §8)."""
    from bole_cli.calibrate.decision import MAX_CHAIN_DEPTH, tree_cap
    from bole_cli.calibrate.sweep import Extras

    chains = min(acceptance.depth, MAX_CHAIN_DEPTH) if acceptance.q is not None else 0
    return Extras(per_request_cap=tree_cap(acceptance), chain_depth=chains,
                  draft_rows=acceptance.top_k)


def run_calibration(plan: CalibrationPlan, *, announce: Optional[Callable[[str], None]] = None,
                    progress: Optional[Progress] = None, plot: bool = True) -> CalibrationResult:
    """Build the StepTimer, `announce` the label, sweep (reporting each step to `progress`
    when measuring, or when an estimate is long), build and write the profile (keeping the
    file's kernels section), and plot it beside the profile."""
    from bole_cli.calibrate.sweep import build_profile, run_sweep, sweep_steps, write_profile
    from bole_cli.interrupts import held, released

    forward = make_forward(plan)
    if announce is not None:
        announce(plan.label)
    extras = sweep_extras(plan.acceptance)
    steps = sweep_steps(plan.batches, plan.kvs, plan.points, extras, forward)
    sweep = None
    with held() as section:  # after the sweep, Ctrl-C must not discard it: finish, then stop
        try:
            with released():  # ... but during the sweep it stops the sweep
                shown = progress and (plan.measured or steps > ESTIMATE_PROGRESS_STEPS)
                with (progress(steps) if shown else nullcontext()) as on_step:
                    sweep = run_sweep(forward, plan.batches, plan.kvs, plan.points,
                                      plan.timing, on_step=on_step, extras=extras,
                                      eps=plan.eps, acceptance=plan.acceptance)
        except KeyboardInterrupt:
            if sweep is None:  # nothing measured yet
                raise
            sweep.interrupted = True  # e.g. while the progress bar closed
        if not sweep.curves:
            why = sweep.failures[0] if sweep.failures else "interrupted"
            raise BoleError(f"no configuration was measured ({why}); nothing written")
        detected = plan.detected
        profile, warnings = build_profile(
            gpu_key=plan.gpu_spec.key, model_name=plan.model_spec.name,
            kind="measured" if plan.measured else "estimated", sweep=sweep, grid=plan.points,
            eps=plan.eps, acceptance=plan.acceptance,
            device_name=(getattr(forward, "device_name", None)
                         or (detected.name if detected else plan.gpu_spec.name)),
            command=plan.command,
            note="; ".join(x for x in ((plan.label if not plan.measured else ""), plan.note)
                           if x),
            extra_provenance=_provenance_extra(plan, forward))
        if plan.model_spec.mtp_layers < 1:  # the decision is still sound for an EAGLE head
            warnings.insert(0, f"{plan.model_spec.name} has no MTP layer (its config's "
                               "mtp_num_hidden_layers): the drafter priced is an MTP-style head "
                               "of its width; `bole serve` speculates with --draft-model (EAGLE)")
        # what its draft_level prices (profiles/schema.py); written even when None, so a
        # full-vocabulary run over a hot-token profile does not keep the old head's field
        profile["draft_vocab"] = plan.draft_vocab
        path = plan.path
        if sweep.interrupted and path.exists():  # beside, never over, the profile of an earlier run
            path = partial_path(path)
        profile = write_profile(path, profile)  # as written: with the file's kernels
    interrupted = sweep.interrupted or section.interrupted
    from bole_cli.calibrate.plot import plot_path_for

    png, plot_path = plot_path_for(path), None
    if plot and not interrupted:
        from bole_cli.calibrate.plot import plot_profile

        try:
            plot_path = plot_profile(profile, png)
        except KeyboardInterrupt:  # the profile is written; only the picture is lost
            interrupted = True
    if plot_path is None:
        from bole_cli.paths import stale_plot_note

        stale = stale_plot_note(png, path)
        warnings = warnings + [stale] if stale else warnings
    served, serve_command = served_instead(plan)
    return CalibrationResult(path=path, plot_path=plot_path, label=plan.label,
                             warnings=warnings, profile=profile, interrupted=interrupted,
                             served=served, serve_command=serve_command)
