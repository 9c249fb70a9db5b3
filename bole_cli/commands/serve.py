"""`bole serve --model M`: SGLang 0.5.23 with the Bole plug-in and profile-derived settings.

Finds the calibration profile for (GPU, model), derives SGLang's speculative flags from it
(NEXTN with the model's own MTP head, or EAGLE with --draft-model; draft depth and
top-k from the profile's acceptance model; draft tokens per request = B_ver at the
expected batch / batch), shows them and the full command, and replaces this process with
``python -m sglang.launch_server ...`` under ``SGLANG_PLUGINS=bole``. `--dry-run` prints
only (and works without SGLang or a GPU: name the GPU with --gpu).

Only typer and the standard library are imported at module level (fast `bole --help`).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from bole_cli.errors import BoleError, InputError
from bole_cli.limits import MAX_TREE_NODES as MAX_DRAFT_TOKENS  # a request's draft tree

DEFAULT_PORT = 30000
DEFAULT_BATCH = 8
DEFAULT_KV_LEN = 4096
SERVE_EXTRA = "bole-cli[serve]"
LAUNCH_MODULE = "sglang.launch_server"

# SGLang flags this command sets; the same flag after `--` wins (ours is dropped).
_OURS = ("--model-path", "--speculative-algorithm", "--speculative-draft-model-path",
         "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
         "--max-running-requests", "--host", "--port")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


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


def derive_settings(profile: dict, batch: int, kv_len: int, *, draft_model: Optional[str] = None,
                    steps: Optional[int] = None, topk: Optional[int] = None,
                    draft_tokens: Optional[int] = None) -> dict:
    """The speculative settings for `batch` concurrent requests at context `kv_len`."""
    from bole_cli.profiles import lookup_budget

    if batch < 1:
        raise InputError(f"--batch: must be >= 1, got {batch}")
    if kv_len < 1:
        raise InputError(f"--kv-len: must be >= 1, got {kv_len}")
    for name, value in (("--steps", steps), ("--topk", topk), ("--draft-tokens", draft_tokens)):
        if value is not None and value < 1:
            raise InputError(f"{name}: must be >= 1, got {value}")
    entry, note = lookup_budget(profile, batch, kv_len)
    depth, k, source = tree_shape_from_profile(profile)
    notes = [f"budget: {note}"]
    topk_v = topk if topk is not None else k
    if topk_v < 2:
        raise InputError("--topk: Bole handles trees (top-k >= 2); for chains SGLang needs no plug-in")
    b_ver = int(entry["b_ver"])
    if draft_tokens is not None:
        d = draft_tokens
        notes.append(f"draft tokens per request set by --draft-tokens ({d})")
    else:
        d = b_ver // batch
        if d < 2:
            notes.append(f"B_ver {b_ver} / batch {batch} < 2: using 2 draft tokens per request")
            d = 2
    steps_v = steps if steps is not None else depth
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
    return {
        "algorithm": "EAGLE" if draft_model else "NEXTN",
        "draft_model": draft_model,
        "num_steps": steps_v,
        "eagle_topk": topk_v,
        "num_draft_tokens": d,
        "max_running_requests": batch,
        "batch": batch,
        "kv_len": kv_len,
        "profile_batch": entry["batch"],
        "profile_kv_len": entry["kv_len"],
        "b_ver": b_ver,
        "n_star": entry.get("n_star"),
        "tree_source": source if (steps is None or topk is None) else "--steps / --topk",
        "notes": notes,
    }


def _flag_in(flag: str, args: list[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def build_command(model: str, settings: dict, *, port: int, host: Optional[str] = None,
                  extra: Optional[list[str]] = None, python: Optional[str] = None) -> tuple[list[str], list[str]]:
    """(argv of launch_server, our flags the extra arguments override)."""
    extra = list(extra or [])
    ours: list[tuple[str, Any]] = [
        ("--model-path", model),
        ("--speculative-algorithm", settings["algorithm"]),
    ]
    if settings.get("draft_model"):
        ours.append(("--speculative-draft-model-path", settings["draft_model"]))
    ours += [
        ("--speculative-num-steps", settings["num_steps"]),
        ("--speculative-eagle-topk", settings["eagle_topk"]),
        ("--speculative-num-draft-tokens", settings["num_draft_tokens"]),
        ("--max-running-requests", settings["max_running_requests"]),
    ]
    if host:
        ours.append(("--host", host))
    ours.append(("--port", port))
    argv = [python or sys.executable, "-m", LAUNCH_MODULE]
    overridden = []
    for flag, value in ours:
        if _flag_in(flag, extra):
            overridden.append(flag)
            continue
        argv += [flag, str(value)]
    return argv + extra, overridden


def plugin_env(environ: Optional[dict] = None) -> dict:
    """SGLANG_PLUGINS with `bole` added (SGLang loads only the listed plug-ins when set)."""
    from bole_cli.sglang.plugin import PLUGIN_NAME

    env = dict(os.environ if environ is None else environ)
    names = [n.strip() for n in env.get("SGLANG_PLUGINS", "").split(",") if n.strip()]
    if PLUGIN_NAME not in names:
        names.append(PLUGIN_NAME)
    env["SGLANG_PLUGINS"] = ",".join(names)
    return env


def sglang_status() -> dict:
    """Whether SGLang and the plug-in entry point are installed (no import of sglang)."""
    import importlib.metadata as md
    import importlib.util

    from bole_cli.sglang.compat import SGLANG_VERSION
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
    from bole_cli.sglang.compat import SGLANG_VERSION

    if not status["installed"]:
        raise BoleError(f"SGLang is not installed: pip install '{SERVE_EXTRA}' (SGLang {SGLANG_VERSION})")
    if status["version"] != SGLANG_VERSION:
        raise BoleError(f"SGLang {status['version'] or '(unknown version)'} is installed; Bole's plug-in "
                        f"needs SGLang {SGLANG_VERSION}: pip install '{SERVE_EXTRA}'")
    if not status["plugin_registered"]:
        raise BoleError("the Bole plug-in is not registered with SGLang (entry point 'bole' in "
                        "'sglang.srt.plugins'); reinstall bole-cli (pip install -e . or "
                        f"pip install '{SERVE_EXTRA}')")


def memory_summary(spec: Any, settings: dict, state_dtype: str = "float32") -> Optional[dict]:
    """Per-node snapshot buffers SGLang would preallocate vs Bole's arena (TP 1, bf16)."""
    from bole_cli.sglang.plan import BolePlan

    if spec is None:
        return None
    plan = BolePlan(layers=spec.n_gdn_layers, key_heads=spec.gdn_key_heads, key_dim=spec.gdn_key_dim,
                    value_heads=spec.gdn_value_heads, value_dim=spec.gdn_value_dim,
                    conv_dim=spec.conv_dim, conv_window=spec.conv_kernel - 1,
                    draft_tokens=settings["num_draft_tokens"],
                    rows=settings["max_running_requests"] + 1, act_dtype="bfloat16",
                    conv_dtype="bfloat16", ssm_dtype=state_dtype)
    return {"sglang_snapshot_bytes": plan.snapshot_bytes(), "bole_arena_bytes": plan.arena_bytes(),
            "freed_bytes": plan.saved_bytes(), "state_dtype": state_dtype}


# --------------------------------------------------------------------------- the command


def _resolve(model: str, profile_file: Optional[Path], gpu: Optional[str]):
    """(gpu spec or None, model spec or None, profile path, profile dict, gpu note)."""
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
    gpu_note = ""
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
    if profile_file is not None:
        path = Path(profile_file)
        profile = load_profile(path)
    else:
        path = find_profile(gpu_spec, model_spec)
        if path is None:
            short = model_spec.short_name if hasattr(model_spec, "short_name") else model_spec.name
            dirs = ", ".join(str(d) for d in default_search_dirs())
            raise BoleError(
                f"no profile for {model_spec.name} on {gpu_spec.key} (looked in {dirs}); make one "
                f"with `bole calibrate --gpu {gpu_spec.key} --model {short}` or pass --profile FILE")
        profile = load_profile(path)
    return gpu_spec, model_spec, path, profile, gpu_note


def _panel(result: dict) -> Any:
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from bole_cli.memory import format_bytes

    s = result["settings"]
    t = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    alg = s["algorithm"] + (" (the model's MTP head)" if s["algorithm"] == "NEXTN"
                            else f" (draft model {s['draft_model']})")
    rows = [
        ("model", result["model"]),
        ("GPU", f"{result['gpu'] or '-'}" + (f" ({result['gpu_source']})" if result["gpu_source"] else "")),
        ("profile", f"{result['profile']} ({result['profile_kind']})"),
        ("budget", f"B_ver {s['b_ver']} tree tokens at batch {s['profile_batch']}, kv {s['profile_kv_len']}"
                   + (f"; N* {s['n_star']}" if s.get("n_star") else "")),
        ("algorithm", alg),
        ("draft tree", f"depth {s['num_steps']}, top-k {s['eagle_topk']} ({s['tree_source']})"),
        ("draft tokens", f"{s['num_draft_tokens']} per request x {s['max_running_requests']} requests"),
    ]
    mem = result.get("memory")
    if mem:
        rows.append(("verify memory", f"SGLang snapshots {format_bytes(mem['sglang_snapshot_bytes'])} -> "
                                      f"Bole factors {format_bytes(mem['bole_arena_bytes'])} "
                                      f"({format_bytes(mem['freed_bytes'])} to the KV cache)"))
    st = result["sglang"]
    rows.append(("SGLang", f"{st['version'] or 'not installed'} (plug-in pinned to {st['pinned']}; "
                           f"entry point {'registered' if st['plugin_registered'] else 'missing'})"))
    for k, v in rows:
        t.add_row(k, escape(str(v)))
    parts: list[Any] = [t]
    for n in s["notes"] + result["notes"]:
        parts.append(Text("note: " + n, style="yellow"))
    parts.append(Text(""))
    parts.append(Text(result["command_line"], style="cyan"))
    title = "bole serve (dry run)" if result["dry_run"] else "bole serve"
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


def _launch(argv: list[str], env: dict) -> None:  # replaced in tests
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


def serve(
    model: str = typer.Option(..., "--model", help="Model to serve: a catalogue name (9b, "
                              "Qwen/Qwen3.5-27B, ...) or a local checkpoint/Hugging Face id "
                              "(then with --profile)."),
    profile: Optional[Path] = typer.Option(None, "--profile", metavar="FILE",
                                           help="Calibration profile to use instead of the search."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU whose profile to use (default: "
                                      "the detected one; needed without a GPU, e.g. --dry-run)."),
    batch: int = typer.Option(DEFAULT_BATCH, "--batch", help="Expected concurrent requests: the "
                              "budget is read at this batch size; also --max-running-requests."),
    kv_len: int = typer.Option(DEFAULT_KV_LEN, "--kv-len", "--context", help="Expected context length (KV bucket); --context as in bole bench e2e."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="EAGLE draft model "
                                              "(default: NEXTN with the model's own MTP head)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Draft depth (default: the profile's)."),
    topk: Optional[int] = typer.Option(None, "--topk", help="Drafts per expansion (default: the profile's)."),
    draft_tokens: Optional[int] = typer.Option(None, "--draft-tokens",
                                               help="Tree tokens per request (default: B_ver / batch)."),
    host: Optional[str] = typer.Option(None, "--host", help="Passed to SGLang (its default: 127.0.0.1)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Passed to SGLang."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the settings and command; start nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print the settings and command as JSON."),
    extra: Optional[list[str]] = typer.Argument(
        None, metavar="[-- SGLANG_ARGS...]", show_default=False,
        help="Further launch_server arguments after `--`; a flag given here overrides Bole's."),
) -> None:
    """Serve a model with SGLang 0.5.23 and the Bole plug-in (tree verify without snapshots)."""
    from bole_cli.console import emit_json, err, out

    if not 0 < port < 65536:
        raise InputError(f"--port: {port} is not a TCP port")
    status = sglang_status()
    if not dry_run:
        check_can_launch(status)  # first: without SGLang, one line naming the install
    gpu_spec, model_spec, path, prof, gpu_note = _resolve(model, profile, gpu)
    notes: list[str] = []
    if model_spec is not None and prof.get("model") != model_spec.name:
        notes.append(f"the profile is for {prof.get('model')}, not {model_spec.name}")
    if gpu_spec is not None and prof.get("gpu") != gpu_spec.key:
        notes.append(f"the profile is for GPU {prof.get('gpu')}, not {gpu_spec.key}")
    if model_spec is not None and not draft_model and getattr(model_spec, "mtp_layers", 1) < 1:
        raise InputError(f"{model_spec.name} has no MTP head for NEXTN; pass --draft-model PATH (EAGLE)")
    settings = derive_settings(prof, batch, kv_len, draft_model=draft_model, steps=steps, topk=topk,
                               draft_tokens=draft_tokens)
    # A catalogue alias (9b) becomes its Hugging Face id; a path or unknown id goes as given.
    model_path = (model_spec.name if model_spec is not None and model_spec.source == "catalogue"
                  else model)
    argv, overridden = build_command(model_path, settings, port=port, host=host, extra=extra)
    if overridden:
        notes.append("overridden by the arguments after `--`: " + ", ".join(overridden))
    env = plugin_env()
    state_dtype = "float32"
    for i, a in enumerate(extra or []):
        if a.startswith("--mamba-ssm-dtype="):
            state_dtype = a.split("=", 1)[1]
        elif a == "--mamba-ssm-dtype" and i + 1 < len(extra or []):
            state_dtype = (extra or [])[i + 1]
    try:
        memory = memory_summary(model_spec, settings, state_dtype)
    except (KeyError, ValueError):
        memory = None
    result = {
        "dry_run": dry_run,
        "model": model_path,
        "model_catalogue": model_spec.name if model_spec is not None else None,
        "gpu": gpu_spec.key if gpu_spec is not None else prof.get("gpu"),
        "gpu_source": gpu_note or "profile",
        "profile": str(path),
        "profile_kind": (prof.get("provenance") or {}).get("kind"),
        "settings": settings,
        "memory": memory,
        "command": argv,
        "env": {"SGLANG_PLUGINS": env["SGLANG_PLUGINS"]},
        "command_line": f"SGLANG_PLUGINS={shlex.quote(env['SGLANG_PLUGINS'])} " + shlex.join(argv),
        "sglang": status,
        "notes": notes,
    }
    if json_out:
        emit_json(result)
    else:
        out.print(_panel(result))
    if dry_run:
        return
    if not json_out:
        err.print("starting SGLang ...", highlight=False)
    _launch(argv, env)
