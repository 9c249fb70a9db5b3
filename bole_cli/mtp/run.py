"""`bole acceptance` in order (docs/design.md §8): check every input, load the checkpoint
and its MTP layer, measure prompt by prompt with progress, write the acceptance file.

Every check that needs no weights runs first (the options, the prompt file, transformers,
the checkpoint's config, MTP tensors and tokenizer, the device, the output path), so bad
input fails in a second. Ctrl-C keeps what was measured: the file is written with
`measurement.partial: true` and the prompts done so far, as NAME-partial beside (never
over) a complete file of an earlier run. The file's format is
bole_cli/calibrate/acceptance.py's (measured_document); statistics: stats.py.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from bole_cli.errors import BoleError, InputError
from bole_cli.calibrate.acceptance import DEFAULT_TOP_K

DEFAULT_DEPTH = 8
DEFAULT_TOPK = DEFAULT_TOP_K
DEFAULT_MAX_NEW = 256
#: Tree budgets (tokens per request, root included) whose expected tokens are reported.
REPORT_BUDGETS = (2, 4, 8, 16, 32, 64, 128)
MAX_DEPTH = 32
MAX_TOPK = 32
MAX_NEW_TOKENS = 1 << 16
OUT_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class AcceptanceOptions:
    model: str
    prompts: str
    depth: int = DEFAULT_DEPTH
    topk: int = DEFAULT_TOPK
    max_new: int = DEFAULT_MAX_NEW
    device: Optional[str] = None  # default: cuda when present, else cpu
    out: Optional[Path] = None  # default: paths.acceptance_dir() / acceptance-<checkpoint>.yaml
    plot: bool = True


@dataclass
class AcceptanceResult:
    path: Path
    plot_path: Optional[Path]
    document: dict
    model: Any  # calibrate.acceptance.AcceptanceModel of the matrix
    tally: Any  # stats.RankTally
    interrupted: bool = False
    notes: list = field(default_factory=list)


def _check_options(opts: AcceptanceOptions) -> None:
    from bole_cli.parsing import check_int

    for name, value, top in (("--depth", opts.depth, MAX_DEPTH), ("--topk", opts.topk, MAX_TOPK),
                             ("--max-new", opts.max_new, MAX_NEW_TOKENS)):
        check_int(value, name, maximum=top)
    if opts.max_new < opts.depth:
        raise InputError(f"--max-new ({opts.max_new}) must be at least --depth ({opts.depth}): "
                         "each measured position needs depth tokens of continuation")
    if opts.out is not None and Path(opts.out).suffix.lower() not in OUT_SUFFIXES:
        raise InputError(f"--out: {opts.out} must end in .yaml, .yml or .json")


def _device(spec: Optional[str]) -> str:
    import torch

    if spec is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return spec
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise InputError(f"--device {spec}: no CUDA device is visible here (use --device cpu)")
        return spec
    raise InputError(f"--device: expected cuda, cuda:N or cpu, got {spec!r}")


def _token_ids(tokenizer: Any, prompts: Any) -> list:
    ids = []
    for prompt, line in zip(prompts.prompts, prompts.lines):
        where = f"{prompts.path}:{line}"
        try:
            if isinstance(prompt, list):
                out = tokenizer.apply_chat_template(prompt, add_generation_prompt=True,
                                                    tokenize=True)
                out = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
            else:
                out = tokenizer(prompt)["input_ids"]
        except Exception as exc:  # noqa: BLE001 - e.g. a tokenizer without a chat template
            raise InputError(f"{where}: cannot tokenize ({type(exc).__name__}: "
                             f"{str(exc)[:120]})") from None
        if not out:
            raise InputError(f"{where}: the prompt tokenizes to nothing")
        ids.append(list(out))
    return ids


def _versions() -> dict:
    import torch
    import transformers

    from bole_cli import __version__

    return {"bole": __version__, "torch": str(torch.__version__),
            "transformers": transformers.__version__}


def _command(opts: AcceptanceOptions, device: str, out: Path) -> str:
    parts = ["bole", "acceptance", "--model", str(opts.model), "--prompts", str(opts.prompts),
             "--depth", str(opts.depth), "--topk", str(opts.topk), "--max-new", str(opts.max_new),
             "--device", device, "--out", str(out)]
    return " ".join(shlex.quote(p) for p in parts)


def run_acceptance(opts: AcceptanceOptions, progress: Optional[Callable] = None,
                   predict: Optional[Callable] = None) -> AcceptanceResult:
    """Measure and write (module docstring). `progress(total)` is a context manager that
    yields a per-prompt callback; `predict` is measure.py's test seam."""
    from bole_cli.mtp.checkpoint import inspect_checkpoint, require_transformers
    from bole_cli.mtp.prompts import read_prompts

    _check_options(opts)
    try:
        prompts = read_prompts(opts.prompts)
    except InputError as exc:
        raise InputError(f"--prompts: {exc}") from None
    require_transformers()
    ckpt = inspect_checkpoint(opts.model)
    device = _device(opts.device)
    from bole_cli.console import check_writable
    from bole_cli.paths import acceptance_dir, default_named

    out = Path(opts.out) if opts.out is not None else acceptance_dir() / f"acceptance-{ckpt.path.name}.yaml"
    what = "--out" if opts.out is not None else default_named("acceptance file")
    check_writable(out, what)
    if opts.plot:  # its plot, before the measurement is spent on a file that cannot be drawn
        check_writable(out.with_suffix(".png"), f"{what} (its plot)")
    if out.exists():  # replace a measured acceptance file, never some other file of the user's
        from bole_cli.files import load_structured

        try:
            old = load_structured(out)
        except InputError:
            old = None
        if not (isinstance(old, dict) and isinstance(old.get("measurement"), dict)):
            raise InputError(f"{what}: {out} is not an acceptance file that `bole acceptance` "
                             "measured, so it is not overwritten")

    import torch

    from bole_cli.mtp.checkpoint import load_target, load_tokenizer, read_mtp_tensors
    from bole_cli.mtp.head import build_head
    from bole_cli.mtp.measure import greedy_continuation, teacher_forced_ranks
    from bole_cli.mtp.stats import RankTally

    tokenizer = load_tokenizer(ckpt)
    token_ids = _token_ids(tokenizer, prompts)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    target = load_target(ckpt, device, dtype)
    head = build_head(target, read_mtp_tensors(ckpt), str(ckpt.path))

    tally = RankTally(opts.depth, opts.topk)
    from bole_cli.interrupts import held

    interrupted = False
    started = _dt.datetime.now(_dt.timezone.utc)
    bar = progress(len(token_ids)) if progress is not None else nullcontext(lambda _d: None)
    with bar as step:
        try:
            for i, ids in enumerate(token_ids):
                x = torch.tensor([ids], device=device)
                with torch.no_grad():
                    seq = greedy_continuation(target, x, opts.max_new)
                    got = teacher_forced_ranks(target, head, seq, len(ids), opts.depth,
                                               opts.topk, predict)
                with held() as guard:  # a prompt is counted whole or not at all
                    tally.add(got.ranks, got.generated, got.mismatches)
                if guard.interrupted:
                    raise KeyboardInterrupt
                step(f"prompt {i + 1}/{len(token_ids)}: {tally.anchors} positions")
        except KeyboardInterrupt:
            interrupted = True

    with held() as guard:  # a Ctrl-C now waits until the file is written
        result = _finish(opts, ckpt, prompts, device, dtype, out, tally, started, interrupted)
    result.interrupted = result.interrupted or guard.interrupted
    return result


def _finish(opts, ckpt, prompts, device, dtype, out, tally, started, interrupted) -> AcceptanceResult:
    import torch

    from bole_cli.calibrate.acceptance import from_data, measured_document
    from bole_cli.stats import Z95

    if tally.anchors == 0:  # an all-zero matrix would read as "never accepted"
        raise BoleError("no position was measured (every continuation was shorter than --depth "
                        "tokens, or the run was interrupted at once); nothing written")
    notes = []
    if tally.mismatches:
        notes.append(f"{tally.mismatches} generated tokens differ from the full forward's greedy "
                     "token (near-ties in the model's numerics); labels are the full forward's")
    lo, hi = tally.intervals()
    name = f"{ckpt.path.name} on {prompts.path.name}"
    measurement = {
        "method": "teacher-forced MTP drafts along the target's greedy continuation "
                  "(docs/design.md §8)",
        "checkpoint": str(ckpt.path.resolve()), "model_type": ckpt.model_type,
        "prompts": {"file": str(prompts.path), "sha256": prompts.sha256,
                    "count": len(prompts.prompts), "used": tally.prompts},
        "max_new": opts.max_new, "depth": opts.depth,
        "device": torch.cuda.get_device_name(device) if device != "cpu" else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "versions": _versions(),
        "date": started.isoformat(timespec="seconds"), "command": _command(opts, device, out),
        "partial": interrupted, "anchors": tally.anchors, "generated_tokens": tally.generated,
        "interval": {"level": 0.95, "z": round(Z95, 6), "method": "wilson",
                     "lower": [[round(x, 6) for x in r] for r in lo],
                     "upper": [[round(x, 6) for x in r] for r in hi]},
        "chain": {"trials": list(tally.chain_trials), "hits": list(tally.chain_hits),
                  "committed": round(tally.chain_committed(), 6)},
    }
    doc = measured_document(name, tally.counts, tally.trials, measurement)
    model = from_data(doc, str(out))  # the reader's checks hold for what we write
    trees = [model.per_request(n) for n in REPORT_BUDGETS]
    doc["expected"] = {"chain": round(model.chain(), 6),
                       "chain_measured": round(tally.chain_committed(), 6),
                       "trees": {str(n): round(e, 6) for n, e in zip(REPORT_BUDGETS, trees)}}
    if interrupted:  # beside, never over, a complete file of an earlier run
        from bole_cli.paths import partial_path

        out = partial_path(out)
    path = _write(out, doc)
    plot_path = None
    if opts.plot:
        from bole_cli.mtp.plot import plot_acceptance

        plot_path = plot_acceptance(model.q, REPORT_BUDGETS, trees, model.chain(),
                                    tally.chain_committed(), name, out.with_suffix(".png"))
    else:
        from bole_cli.paths import stale_plot_note

        stale = stale_plot_note(out.with_suffix(".png"), path)
        notes = notes + [stale] if stale else notes
    return AcceptanceResult(path, plot_path, doc, model, tally, interrupted, notes)


def _write(out: Path, doc: dict) -> Path:
    from bole_cli.console import atomic_write_text, dumps_json

    if out.suffix.lower() == ".json":
        return atomic_write_text(out, dumps_json(doc) + "\n")
    from bole_cli.files import dump_yaml

    # rows of numbers in flow style ([0.8, 0.1, ...]): one line per depth
    return atomic_write_text(out, dump_yaml(doc, sort_keys=False, width=100, default_flow_style=None,
                                            allow_unicode=True))
