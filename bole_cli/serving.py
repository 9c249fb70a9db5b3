"""What `bole serve` launches: SGLang's speculative flags from a profile, the command, its env.

Finds the calibration profile for (GPU, model) and applies its decision for the expected
batch and context (docs/design.md §8): a tree -> NEXTN (the model's MTP head) or EAGLE (a
draft model) with the decided depth, top-k and draft tokens, verified by the plug-in; a
chain -> SGLang's top-k 1 flags, verified by the plug-in's chain path or by SGLang's
ReplaySSM (`--enable-linear-replayssm-spec`, --chain-verify); no speculation -> no
speculative flags. Builds ``python -m sglang.launch_server ...`` and the environment that
enables the plug-in (docs/design.md §6). Runs in the CLI's process, not SGLang's, so it lives
outside bole_cli/sglang/; nothing here imports sglang, and only the standard library and
bole_cli's light modules load at import (this module is on the `bole --help` path).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Optional

from bole_cli import env as flags
from bole_cli.errors import BoleError, InputError
from bole_cli.limits import MAX_TREE_NODES as MAX_DRAFT_TOKENS  # a request's draft tree

DEFAULT_PORT = 30000
DEFAULT_BATCH = 8
DEFAULT_KV_LEN = 4096
LAUNCH_MODULE = "sglang.launch_server"


# --------------------------------------------------------------------------- derivation


def tree_shape_from_profile(profile: dict) -> tuple[int, int, str]:
    """(draft depth, top-k, where from): the profile's acceptance model, else the paper's."""
    from bole_cli.calibrate.acceptance import DEFAULT_TOP_K, PAPER_DEPTH

    rows = (profile.get("acceptance") or {}).get("per_depth_rank")
    if isinstance(rows, list) and rows and all(isinstance(r, list) and r for r in rows):
        name = (profile.get("acceptance") or {}).get("name") or "profile"
        return len(rows), len(rows[0]), f"acceptance model {name!r}"
    return PAPER_DEPTH, DEFAULT_TOP_K, "defaults (no acceptance model in the profile)"


def max_tree_tokens(steps: int, topk: int) -> int:
    """SGLang's EAGLE tree: the root plus the best of topk + (steps-1)*topk^2 candidates."""
    return 1 + topk + max(steps - 1, 0) * topk * topk


CHAIN_VERIFIERS = ("bole", "replayssm")  # the plug-in's chain path, or SGLang's own
REPLAYSSM_DEFAULT_WINDOW = 16  # SGLang's --linear-replayssm-cache-len default (docs/sglang-0.5.23.md)


def _predicted(choice: Optional[dict]) -> Optional[dict]:
    if not choice:
        return None
    return {k: choice[k] for k in ("label", "mode", "tokens", "tok_s", "speedup", "step_s",
                                   "t_draft", "t_verify", "t_sample") if k in choice}


def _why(decision: dict) -> str:
    """One line: why the decided mode (against the runner-up, drafting counted)."""
    ch, ru = decision["chosen"], decision.get("runner_up")
    line = f"{ch['label']}: predicted {ch['speedup']:.2f}x over plain decoding, drafting counted"
    if ru:
        slower = (1 - ru["tok_s"] / ch["tok_s"]) * 100
        line += f"; {ru['label']} would be {slower:.1f}% slower" if slower < 10 else \
            f"; {ru['label']} would be {slower:.0f}% slower"
    return line


@dataclass(frozen=True)
class ServeSettings:
    """How `bole serve` runs SGLang: the mode, why, the bucket it was read at and the
    speculative flags (None without speculation). `to_dict` is its JSON form."""

    mode: str  # "none", "chain" or "tree"
    why: str
    batch: int
    kv_len: int
    max_running_requests: int
    profile_batch: int  # the profile's bucket the decision was read at
    profile_kv_len: int
    b_ver: int
    n_star: Optional[int]
    predicted: Optional[dict]  # the decided choice's prices; None when set by hand
    runner_up: Optional[dict]
    algorithm: Optional[str]  # "NEXTN" (the MTP head) or "EAGLE" (a draft model)
    draft_model: Optional[str]
    num_steps: Optional[int]
    eagle_topk: Optional[int]
    num_draft_tokens: Optional[int]
    chain_verify: Optional[str]  # one of CHAIN_VERIFIERS, chains only
    plugin: bool  # whether the Bole plug-in verifies
    notes: tuple[str, ...]
    tree_source: str

    def to_dict(self) -> dict[str, Any]:
        """The fields in order, notes as a list: what --json prints."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["notes"] = list(self.notes)
        return d


def derive_settings(profile: dict, batch: int, kv_len: int, *, draft_model: Optional[str] = None,
                    steps: Optional[int] = None, topk: Optional[int] = None,
                    draft_tokens: Optional[int] = None,
                    chain_verify: Optional[str] = None, source: str = "the profile") -> ServeSettings:
    """How to serve `batch` concurrent requests at context `kv_len`: the profile's decision
    for that bucket (docs/design.md §8: no speculation, a chain or a Bole tree, drafting
    counted), or the tree or chain that --steps / --topk / --draft-tokens ask for. `source`
    names the profile in an error."""
    from bole_cli.profiles import lookup_budget

    from bole_cli.limits import MAX_BATCH_REQUESTS, MAX_CONTEXT_TOKENS, MAX_TREE_DRAFTS
    from bole_cli.parsing import check_int

    check_int(batch, "--batch", maximum=MAX_BATCH_REQUESTS)
    check_int(kv_len, "--kv-len", maximum=MAX_CONTEXT_TOKENS)
    # one limit for trees and chains: a request verifies at most MAX_DRAFT_TOKENS tokens,
    # so it drafts at most MAX_TREE_DRAFTS levels (a chain) or candidates (one node); a
    # larger --draft-tokens is clamped below, as the tree's own size clamps it
    check_int(steps, "--steps", maximum=MAX_TREE_DRAFTS)
    check_int(topk, "--topk", maximum=MAX_TREE_DRAFTS)
    check_int(draft_tokens, "--draft-tokens")
    if chain_verify is not None and chain_verify not in CHAIN_VERIFIERS:
        raise InputError(f"--chain-verify: expected one of {', '.join(CHAIN_VERIFIERS)}, "
                         f"got {chain_verify!r}")
    entry, note = lookup_budget(profile, batch, kv_len)
    notes = [f"budget: {note}"]
    decision = entry.get("decision")
    manual = any(v is not None for v in (steps, topk, draft_tokens))
    if decision is None and not manual:
        raise InputError(
            f"{source} has no decision for batch {entry['batch']}, kv {entry['kv_len']} "
            "(made without drafter costs or an acceptance model, or by an older bole): re-run "
            "`bole calibrate`, or give --steps, --topk and --draft-tokens")
    chosen = decision["chosen"] if decision else None
    depth, k, _ = tree_shape_from_profile(profile)
    if manual:
        if topk == 1 or (topk is None and chosen and chosen["mode"] == "chain"
                         and draft_tokens is None):
            mode = "chain"
        else:
            mode = "tree"
        why = "set by --steps / --topk / --draft-tokens (not the decision; not priced)"
        chosen_for_mode = (decision or {}).get("best", {}).get(mode)
    else:
        mode, why, chosen_for_mode = chosen["mode"], _why(decision), chosen

    base = ServeSettings(
        mode=mode, why=why, batch=batch, kv_len=kv_len, max_running_requests=batch,
        profile_batch=entry["batch"], profile_kv_len=entry["kv_len"], b_ver=int(entry["b_ver"]),
        n_star=entry.get("n_star"), predicted=None if manual else _predicted(chosen),
        runner_up=_predicted((decision or {}).get("runner_up")) if not manual else None,
        algorithm=None, draft_model=draft_model, num_steps=None, eagle_topk=None,
        num_draft_tokens=None, chain_verify=None, plugin=False, notes=(),
        tree_source="the profile's decision" if not manual else "--steps / --topk / --draft-tokens",
    )
    if chain_verify is not None and mode != "chain":
        notes.append(f"--chain-verify {chain_verify} ignored: the mode here is "
                     f"{'no speculation' if mode == 'none' else 'a tree'}")
    if mode == "none":
        notes.append("no speculation: at this batch and context drafting costs more than the "
                     "accepted tokens save")
        return replace(base, notes=tuple(notes))
    algorithm = "EAGLE" if draft_model else "NEXTN"
    if mode == "chain":
        d = steps or (chosen_for_mode or {}).get("depth") or depth
        verify = chain_verify or (chosen_for_mode or {}).get("verify") or CHAIN_VERIFIERS[0]
        if draft_tokens is not None and draft_tokens != d + 1:
            notes.append(f"--draft-tokens {draft_tokens} -> {d + 1}: a chain of depth {d} "
                         "verifies its drafts and the root")
        return replace(base, algorithm=algorithm, num_steps=d, eagle_topk=1,
                       num_draft_tokens=d + 1, chain_verify=verify, plugin=verify == "bole",
                       notes=tuple(notes))
    topk_v = topk or (chosen_for_mode or {}).get("topk") or k
    if topk_v < 2:
        topk_v = k if k >= 2 else 2
    steps_v = steps or (chosen_for_mode or {}).get("depth") or depth
    if draft_tokens is not None:
        d = draft_tokens
        notes.append(f"draft tokens per request set by --draft-tokens ({d})")
    else:
        budget = (chosen_for_mode or {}).get("budget") or int(entry["b_ver"])
        d = max(2, budget // entry["batch"])
    cap = max_tree_tokens(steps_v, topk_v)
    if d > cap:
        notes.append(f"draft tokens {d} -> {cap}: the most an EAGLE tree of depth {steps_v} and "
                     f"top-k {topk_v} proposes")
        d = cap
    if d > MAX_DRAFT_TOKENS:
        notes.append(f"draft tokens {d} -> {MAX_DRAFT_TOKENS}: Bole's per-request tree limit")
        d = MAX_DRAFT_TOKENS
    if d < 2:
        raise InputError("--draft-tokens: a tree needs at least 2 tokens (the root and one draft)")
    if steps is None and steps_v > d - 1:
        notes.append(f"draft depth {steps_v} -> {d - 1}: a tree of {d} tokens is at most that deep")
        steps_v = d - 1
    elif steps_v > d - 1:  # the user's --steps kept, but its deepest levels cannot be verified
        notes.append(f"--steps {steps_v}: a tree of {d} tokens verifies at most {d - 1} level{'s' * (d != 2)}; "
                     "the drafter's deeper levels are wasted (raise --draft-tokens)")
    return replace(base, algorithm=algorithm, num_steps=steps_v, eagle_topk=topk_v,
                   num_draft_tokens=d, plugin=True, notes=tuple(notes))


def _flag_in(flag: str, args: list[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


TOKEN_MAP_FLAG = "--speculative-token-map"  # SGLang's hot-token table for the drafter


def _flag_value(flag: str, extra: Optional[list[str]], wanted: str) -> Optional[str]:
    """The last value of `flag` among SGLang's extra arguments (`--flag v` or `--flag=v`).
    Given without one (last, `--flag=`, or followed by another flag) it is refused here, as
    SGLang's parser would refuse it at launch; `wanted` says what the value is."""
    args, value = list(extra or []), None
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        elif a == flag:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        else:
            continue
        if not value:
            raise InputError(f"{flag} after `--` needs a value: {wanted}")
    return value


def _token_map_file(value: str) -> Optional[Path]:
    """Where the map SGLang will load lies on this machine: the path itself, or for a hub path
    (`org/repo/file`, which SGLang downloads at launch when no such file exists) the file in
    the local Hugging Face cache, looked up without the network; None where neither is. A
    local path (`/`, `./`, `../`, `~`: SGLang does not expand it) or a name without `/` is
    no hub path: missing, it is refused, as SGLang would fail on it at launch."""
    if Path(value).is_file():
        return Path(value)
    if value.startswith(("/", "./", "../", "~")) or "/" not in value:
        raise InputError(f"{TOKEN_MAP_FLAG}: {value}: no such file (SGLang would take it for a hub "
                         "path, repo/file, and fail at launch)")
    repo, _, name = value.rpartition("/")
    try:  # huggingface_hub comes with SGLang and transformers, not with Bole
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo, name)
    except Exception:  # not installed, or not a repository id the hub would take
        return None
    return Path(hit) if isinstance(hit, str) and Path(hit).is_file() else None


def token_map_size(extra: Optional[list[str]]) -> Optional[int]:
    """How many hot tokens the --speculative-token-map after `--` holds, read as SGLang reads
    it (torch.load); None without one, or where it is neither a local file nor in the local
    Hugging Face cache (a hub map not downloaded yet: SGLang fetches it at launch)."""
    value = _flag_value(TOKEN_MAP_FLAG, extra, "the token map's file or hub path")
    path = None if value is None else _token_map_file(value)
    if path is None:
        return None
    import torch

    try:
        return len(torch.load(path, weights_only=True, map_location="cpu"))
    except Exception as exc:  # whatever the file is, say which one and stop before launching
        where = value if path == Path(value) else f"{value} (cached as {path})"
        raise InputError(f"{TOKEN_MAP_FLAG}: {where} is not a token map SGLang can load ({type(exc).__name__})") from None


def hot_token_note(profile: dict, mode: str, extra: Optional[list[str]] = None,
                   vocab: Optional[int] = None, map_size: Optional[int] = None) -> Optional[str]:
    """When the decision's drafter and the served one differ in their vocabulary: the
    profile priced a hot-token head (`bole calibrate --draft-vocab`) and no token map is
    passed to SGLang, or the map passed is not the one it priced (`map_size`: its tokens
    where token_map_size read it; `vocab`: the model's, where known)."""
    from bole_cli.profiles import draft_vocab_of, drafter_words

    if mode == "none":
        return None
    hot, mapped = draft_vocab_of(profile, vocab), _flag_in(TOKEN_MAP_FLAG, list(extra or []))
    if not mapped:
        return None if not hot else (
            f"the profile prices a drafter over {hot:,} hot tokens (bole calibrate --draft-vocab): "
            f"pass SGLang that map after `--` ({TOKEN_MAP_FLAG} FILE), or calibrate without it")
    if map_size is None:  # a map not read here: only a full-vocabulary profile is known to differ
        return None if hot else (f"{TOKEN_MAP_FLAG}: the profile prices the full vocabulary's drafter; "
                                 "`bole calibrate --draft-vocab N` prices one over the map's N tokens")
    if map_size != (hot or vocab):
        return (f"{TOKEN_MAP_FLAG} holds {map_size:,} tokens and the profile prices a drafter over "
                f"{drafter_words(hot)}: `bole calibrate --draft-vocab {map_size}` prices the map's")
    return None


def build_command(model: str, settings: ServeSettings, *, port: int, host: Optional[str] = None,
                  extra: Optional[list[str]] = None, python: Optional[str] = None) -> tuple[list[str], list[str]]:
    """(argv of launch_server, our flags the extra arguments override)."""
    extra = list(extra or [])
    ours: list[tuple[str, Any]] = [("--model-path", model)]
    if settings.mode != "none":
        ours.append(("--speculative-algorithm", settings.algorithm))
        if settings.draft_model:
            ours.append(("--speculative-draft-model-path", settings.draft_model))
        ours += [
            ("--speculative-num-steps", settings.num_steps),
            ("--speculative-eagle-topk", settings.eagle_topk),
            ("--speculative-num-draft-tokens", settings.num_draft_tokens),
        ]
    if settings.chain_verify == "replayssm":
        ours.append(("--enable-linear-replayssm-spec", None))
        if settings.num_draft_tokens > REPLAYSSM_DEFAULT_WINDOW:  # 0.5.23 does not check it
            window = 1 << (settings.num_draft_tokens - 1).bit_length()
            ours.append(("--linear-replayssm-cache-len", window))
    ours.append(("--max-running-requests", settings.max_running_requests))
    if host:
        ours.append(("--host", host))
    ours.append(("--port", port))
    argv = [python or sys.executable, "-m", LAUNCH_MODULE]
    overridden = []
    for flag, value in ours:
        if _flag_in(flag, extra):
            overridden.append(flag)
            continue
        argv += [flag] if value is None else [flag, str(value)]
    return argv + extra, overridden


def plugin_env(environ: Optional[dict] = None) -> dict:
    """SGLANG_PLUGINS with `bole` added (SGLang loads only the listed plug-ins when set).
    The plug-in is listed in every mode: it takes only the verifies it is meant for and
    steps aside on its own under SGLang's ReplaySSM or without speculation (docs/design.md
    §6), so one environment serves every decision."""
    from bole_cli.sglang.plugin import PLUGIN_NAME

    env = dict(os.environ if environ is None else environ)
    names = [n.strip() for n in env.get("SGLANG_PLUGINS", "").split(",") if n.strip()]
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    env["SGLANG_PLUGINS"] = ",".join(names)
    return env


def state_dtype_from_args(extra: Optional[list[str]], default: str = "float32") -> str:
    """The --mamba-ssm-dtype among SGLang's extra arguments (`--flag v` or `--flag=v`), one
    of the dtypes SGLang's parser takes (refused here otherwise, before the launch)."""
    from bole_cli.memory import FLOAT_DTYPES

    flag, choices = "--mamba-ssm-dtype", ", ".join(FLOAT_DTYPES)
    value = _flag_value(flag, extra, f"the recurrent state's dtype ({choices})")
    if value is not None and value not in FLOAT_DTYPES:
        raise InputError(f"{flag} after `--`: {value!r} is not one SGLang takes ({choices})")
    return default if value is None else value


# --------------------------------------------------------------------------- SGLang present?


def sglang_status() -> dict:
    """Whether SGLang and the plug-in entry point are installed (no import of sglang)."""
    import importlib.metadata as md
    import importlib.util

    from bole_cli.sglang.source import SGLANG_VERSION
    from bole_cli.sglang.plugin import ENTRY_POINT, ENTRY_POINT_GROUP, PLUGIN_NAME

    try:
        installed = importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        installed = False
    version = None
    if installed:
        try:
            version = md.version("sglang")
        except md.PackageNotFoundError:
            version = None
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == PLUGIN_NAME]
    return {
        "installed": installed,
        "version": version,
        "pinned": SGLANG_VERSION,
        "plugin_registered": any(ep.value == ENTRY_POINT for ep in eps),
    }


def check_can_launch(status: dict) -> None:
    """BoleError naming the install step when `status` says SGLang cannot run the plug-in."""
    from bole_cli.errors import install_hint
    from bole_cli.sglang.source import SGLANG_VERSION

    if not status["installed"]:
        raise BoleError(f"SGLang is not installed: {install_hint('serve')}")
    if status["version"] != SGLANG_VERSION:
        raise BoleError(f"SGLang {status['version'] or '(unknown version)'} is installed; Bole's plug-in "
                        f"needs SGLang {SGLANG_VERSION}: {install_hint('serve')}")
    if not status["plugin_registered"]:
        raise BoleError("the Bole plug-in is not registered with SGLang (entry point 'bole' in "
                        "'sglang.srt.plugins'); reinstall bole-cli from its checkout "
                        "(pip install -e .)")


def memory_summary(spec: Any, settings: ServeSettings,
                   state_dtype: str = "float32") -> Optional[dict]:
    """Per-node snapshot buffers SGLang would preallocate vs Bole's arena (TP 1, bf16), when
    the plug-in verifies (a tree, or a chain through Bole)."""
    from bole_cli.sglang.plan import BolePlan

    if spec is None or not settings.plugin:
        return None
    plan = BolePlan(layers=spec.n_gdn_layers, key_heads=spec.gdn_key_heads, key_dim=spec.gdn_key_dim,
                    value_heads=spec.gdn_value_heads, value_dim=spec.gdn_value_dim,
                    conv_dim=spec.conv_dim, conv_window=spec.conv_kernel - 1,
                    draft_tokens=settings.num_draft_tokens,
                    rows=settings.max_running_requests + 1, act_dtype="bfloat16",
                    conv_dtype="bfloat16", ssm_dtype=state_dtype,
                    chain=settings.eagle_topk == 1, draft_steps=settings.num_steps)
    return {"sglang_snapshot_bytes": plan.snapshot_bytes(), "bole_arena_bytes": plan.arena_bytes(),
            "bole_scratch_bytes": plan.scratch_bytes(), "freed_bytes": plan.saved_bytes(),
            "state_dtype": state_dtype}


# --------------------------------------------------------------------------- the whole plan


def resolve_profile(model: str, profile_file: Optional[Path], gpu: Optional[str],
                    draft_vocab: Optional[int] = None):
    """(gpu spec or None, model spec or None, profile path, profile dict, gpu note, notes: a
    detected card that is another part of its catalogue family (a PCIe card), the unreadable
    profiles passed over in the search, a user's own included). `draft_vocab`: the
    served token map's size; the search takes that head's profile first where there is one."""
    from bole_cli.catalog.hardware import detect_gpu, known_gpu_names, resolve_gpu
    from bole_cli.catalog.models import resolve_model
    from bole_cli.profiles import default_search_dirs, find_profile, load_profile

    try:
        model_spec = resolve_model(model)
    except InputError:
        if profile_file is None:
            raise InputError(
                f"--model {model!r} is neither a catalogue model nor a config.json; give its "
                "calibration profile with --profile FILE (see `bole models`)") from None
        model_spec = None
    gpu_note, skipped, mismatch = "", [], []
    if gpu is not None:
        gpu_spec = resolve_gpu(gpu)
        gpu_note = "--gpu"
    elif profile_file is not None:
        gpu_spec = None
    else:
        detected = detect_gpu()
        if detected is None or detected.spec is None:
            what = f"{detected.name} is not in the catalogue" if detected else "no CUDA GPU detected"
            raise InputError(f"{what}; name the GPU whose profile to use with --gpu "
                             f"({', '.join(known_gpu_names())})")
        gpu_spec = detected.spec
        gpu_note = f"detected {detected.name}"
        mismatch = [detected.mismatch] if detected.mismatch else []  # another part of its family
    if profile_file is not None:
        path = Path(profile_file)
        try:
            profile = load_profile(path)
        except InputError as exc:
            raise InputError(f"--profile: {exc}") from None
        if not profile.get("configs"):
            raise InputError(f"--profile: {path} holds no budget configurations (a kernels table?); "
                             "give a calibration profile that `bole calibrate` wrote")
    else:
        path = ((draft_vocab and find_profile(gpu_spec, model_spec, skipped=skipped, draft_vocab=draft_vocab))
                or find_profile(gpu_spec, model_spec, skipped=skipped))
        if path is None:
            short = model_spec.short_name if hasattr(model_spec, "short_name") else model_spec.name
            dirs = ", ".join(str(d) for d in default_search_dirs())
            unreadable = f"; {skipped[0]} (fix or move it)" if skipped else ""
            raise BoleError(
                f"no profile for {model_spec.name} on {gpu_spec.key} (looked in {dirs}){unreadable}; make "
                f"one with `bole calibrate --gpu {gpu_spec.key} --model {short}` or pass --profile FILE")
        profile = load_profile(path)
    return gpu_spec, model_spec, path, profile, gpu_note, mismatch + [
        f"passed over an unreadable profile: {why}" for why in skipped]


def _catalogue_name(name: Any) -> Optional[str]:
    """The catalogue's name for a profile's model (its own, or a config's that names a
    catalogue model), None for a model the catalogue does not know (a fine-tune, a config
    folder): only two known models that differ are known to be different models."""
    from bole_cli.catalog.models import resolve_model

    if not isinstance(name, str):
        return None
    try:
        spec = resolve_model(name)
    except BoleError:
        return None
    return spec.name if spec.source == "catalogue" else None


@dataclass(frozen=True)
class ServePlan:
    """What `bole serve` shows (`report`, its JSON, and `settings`, typed) and what it execs
    (`argv` under `env`)."""

    report: dict
    settings: ServeSettings
    argv: list
    env: dict


def sglang_model_path(model: str, model_spec: Any) -> str:
    """SGLang's --model-path for `--model`: a catalogue alias (9b) becomes its Hugging Face
    id, a checkpoint's config.json its folder (SGLang loads the folder), a folder or an
    unknown id goes as given. A config file of another name cannot be loaded: refused."""
    if model_spec is None:
        return model
    if model_spec.source == "catalogue":
        return model_spec.name
    given = Path(model).expanduser()  # SGLang does not expand ~
    if given.is_dir():
        return str(given)
    if given.name == "config.json":
        return str(given.parent)
    raise InputError(f"--model: {model} is a config file, not a checkpoint; SGLang loads a "
                     "checkpoint's folder (its config.json beside the weights) or a hub id")


def plan_serve(model: str, *, profile: Optional[Path] = None, gpu: Optional[str] = None,
               batch: int = DEFAULT_BATCH, kv_len: int = DEFAULT_KV_LEN,
               draft_model: Optional[str] = None, steps: Optional[int] = None,
               topk: Optional[int] = None, draft_tokens: Optional[int] = None,
               host: Optional[str] = None, port: int = DEFAULT_PORT, dry_run: bool = False,
               extra: Optional[list[str]] = None, chain_verify: Optional[str] = None) -> ServePlan:
    """Settings, command line and environment for serving `model`. Every option is checked
    before SGLang is (unless `dry_run`, without SGLang: one error naming the install), so a
    typo is named as a typo on a machine without SGLang too."""
    if not 0 < port < 65536:
        raise InputError(f"--port: {port} is not a TCP port")
    if host is not None and not host.strip():
        raise InputError("--host: an empty address; leave --host out for SGLang's default")
    if draft_model is not None and not draft_model.strip():
        raise InputError("--draft-model: an empty path; leave --draft-model out for the model's own MTP "
                         "head (NEXTN)")
    if draft_model is not None and draft_model.startswith(("/", "./", "../", "~")) \
            and not Path(draft_model).expanduser().exists():  # a local path, not a hub id
        raise InputError(f"--draft-model: {draft_model}: no such folder (a local path; SGLang "
                         "would fail on it at launch)")
    status = sglang_status()
    state_dtype = state_dtype_from_args(extra)  # the cheap check first: the map is read from disk
    map_size = token_map_size(extra)
    gpu_spec, model_spec, path, prof, gpu_note, notes = resolve_profile(model, profile, gpu, map_size)
    if model_spec is not None and prof.get("model") != model_spec.name:
        other = _catalogue_name(prof.get("model"))
        if profile is not None and model_spec.source == "catalogue" and other not in (None, model_spec.name):
            raise InputError(f"--profile: {path} is a profile of {other}, not of {model_spec.name}: "
                             "its decisions do not hold for this model")
        notes.append(f"the profile is for {prof.get('model')}, not {model_spec.name}")
    if gpu_spec is not None and prof.get("gpu") != gpu_spec.key:
        notes.append(f"the profile is for GPU {prof.get('gpu')}, not {gpu_spec.key}")
    if model_spec is not None and not draft_model and getattr(model_spec, "mtp_layers", 1) < 1:
        raise InputError(f"{model_spec.name} has no MTP head for NEXTN; pass --draft-model PATH (EAGLE)")
    settings = derive_settings(prof, batch, kv_len, draft_model=draft_model, steps=steps, topk=topk,
                               draft_tokens=draft_tokens, chain_verify=chain_verify, source=str(path))
    model_path = sglang_model_path(model, model_spec)
    argv, overridden = build_command(model_path, settings, port=port, host=host, extra=extra)
    hot = hot_token_note(prof, settings.mode, extra, getattr(model_spec, "vocab", None), map_size)
    if hot:
        notes.append(hot)
    if overridden:
        notes.append("overridden by the arguments after `--`: " + ", ".join(overridden))
    env = plugin_env()
    ours = {"SGLANG_PLUGINS": env["SGLANG_PLUGINS"]}
    if settings.chain_verify == "bole":  # a user's BOLE_CHAINS=0 must not undo it
        ours[flags.CHAINS] = env[flags.CHAINS] = "1"
    ours = dict(sorted(ours.items()))  # the order --json prints them in
    try:
        memory = memory_summary(model_spec, settings, state_dtype)
    except (KeyError, ValueError):
        memory = None
    if not dry_run:
        check_can_launch(status)
    report = {
        "dry_run": dry_run,
        "model": model_path,
        "model_catalogue": model_spec.name if model_spec is not None else None,
        "gpu": gpu_spec.key if gpu_spec is not None else prof.get("gpu"),
        "gpu_source": gpu_note or "profile",
        "profile": str(path),
        "profile_kind": (prof.get("provenance") or {}).get("kind"),
        "settings": settings.to_dict(),
        "memory": memory,
        "command": argv,
        "env": ours,
        "command_line": " ".join(f"{k}={shlex.quote(v)}" for k, v in ours.items()) + " "
                        + shlex.join(argv),
        "sglang": status,
        "notes": notes,
    }
    return ServePlan(report=report, settings=settings, argv=argv, env=env)
