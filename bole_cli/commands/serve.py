"""`bole serve --model M`: SGLang 0.5.23 with the Bole plug-in and profile-derived settings.

bole_cli.serving finds the profile and derives SGLang's speculative flags, the command and
its environment (docs/design.md §6, §8); this module shows them and replaces this process
with ``python -m sglang.launch_server ...`` under ``SGLANG_PLUGINS=bole``. `--dry-run`
prints only (and works without SGLang or a GPU: name the GPU with --gpu).

Only typer, the standard library and bole_cli.serving (itself light) load at module level.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperCommand

from bole_cli.commands import int_option, path_value
from bole_cli.serving import CHAIN_VERIFIERS, DEFAULT_BATCH, DEFAULT_KV_LEN, DEFAULT_PORT, ServeSettings


_DASHDASH = "bole.serve.dashdash"  # ctx.meta: whether `--` came on the command line


class ServeCommand(TyperCommand):
    """Typer's command, noting whether `--` was given: click keeps no trace of it, and SGLang's
    arguments must come after it (a stray word before is a typo, not a launch_server flag)."""

    def parse_args(self, ctx, args):
        ctx.meta[_DASHDASH] = "--" in args
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    app.command("serve", cls=ServeCommand)(serve)


def _panel(result: dict, s: ServeSettings) -> Any:
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from bole_cli.memory import format_bytes

    t = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")  # a long profile path wraps, never ends in "..."
    mode = {"none": "no speculation",
            "chain": "chain, verified by " + ("the Bole plug-in" if s.chain_verify == "bole"
                                              else "SGLang's ReplaySSM"),
            "tree": "tree, verified by the Bole plug-in"}[s.mode]
    rows = [
        ("model", result["model"]),
        ("GPU", f"{result['gpu'] or '-'}" + (f" ({result['gpu_source']})" if result["gpu_source"] else "")),
        ("profile", f"{result['profile']} ({result['profile_kind']})"),
        ("mode", f"{mode} (batch {s.profile_batch}, kv {s.profile_kv_len})"),
        ("why", s.why),
        ("B_ver", f"{s.b_ver} tree tokens (Eq. 12, the paper's rule)"),
    ]
    if s.mode != "none":  # (no algorithm without speculation)
        alg = s.algorithm + (" (the model's MTP head)" if s.algorithm == "NEXTN"
                             else f" (draft model {s.draft_model})")
        rows += [
            ("algorithm", alg),
            ("draft", f"depth {s.num_steps}, top-k {s.eagle_topk} ({s.tree_source})"),
            ("draft tokens", f"{s.num_draft_tokens} per request x {s.max_running_requests} "
                             f"request{'s' if s.max_running_requests != 1 else ''}"),
        ]
    mem = result.get("memory")
    if mem:
        scratch = f" + scratch {format_bytes(mem['bole_scratch_bytes'])}" if mem["bole_scratch_bytes"] else ""
        rows.append(("verify memory", f"SGLang snapshots {format_bytes(mem['sglang_snapshot_bytes'])} -> "
                                      f"Bole factors {format_bytes(mem['bole_arena_bytes'])}{scratch} "
                                      f"({format_bytes(mem['freed_bytes'])} to the KV cache)"))
    st = result["sglang"]
    rows.append(("SGLang", f"{st['version'] or 'not installed'} (plug-in pinned to {st['pinned']}; "
                           f"entry point {'registered' if st['plugin_registered'] else 'missing'})"))
    for k, v in rows:
        t.add_row(k, escape(str(v)))
    parts: list[Any] = [t]
    for n in [*s.notes, *result["notes"]]:
        parts.append(Text("note: " + n, style="yellow"))
    title = "bole serve (dry run)" if result["dry_run"] else "bole serve"
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


def _launch(argv: list[str], env: dict, *, stdout_to_stderr: bool = False) -> None:  # replaced in tests
    """Become SGLang's launch_server; under --json its output goes to stderr, so stdout holds
    the JSON alone (a `| jq` reads it while the server runs)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if stdout_to_stderr:
        os.dup2(2, 1)
    os.execvpe(argv[0], argv, env)


def serve(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="Model to serve: a catalogue name (9b, "
                              "Qwen/Qwen3.5-27B, ...) or a local checkpoint/Hugging Face id "
                              "(then with --profile)."),
    profile: Optional[Path] = typer.Option(None, "--profile", parser=path_value, metavar="FILE",
                                           help="Calibration profile to use instead of the search."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU whose profile to use (default: "
                                      "the detected one; needed without a GPU, e.g. --dry-run)."),
    batch: int = int_option(DEFAULT_BATCH, "--batch", help="Expected concurrent requests: the "
                            "budget is read at this batch size; also --max-running-requests."),
    kv_len: int = int_option(DEFAULT_KV_LEN, "--kv-len", "--context", help="Expected context length (KV bucket); --context as in bole bench e2e."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="EAGLE draft model "
                                              "(default: NEXTN with the model's own MTP head)."),
    steps: Optional[int] = int_option(None, "--steps", help="Draft depth (default: the profile's decision)."),
    topk: Optional[int] = int_option(None, "--topk", help="Drafts per expansion; 1 is a chain "
                                     "(default: the profile's decision)."),
    draft_tokens: Optional[int] = int_option(None, "--draft-tokens",
                                             help="Tree tokens per request (default: the "
                                                  "profile's decision)."),
    chain_verify: Optional[str] = typer.Option(None, "--chain-verify", metavar="|".join(CHAIN_VERIFIERS),
                                               help="Who verifies a chain: the Bole plug-in or SGLang's "
                                                    "ReplaySSM (default: the profile's decision, else "
                                                    f"{CHAIN_VERIFIERS[0]})."),
    host: Optional[str] = typer.Option(None, "--host", help="Passed to SGLang (its default: 127.0.0.1)."),
    port: int = int_option(DEFAULT_PORT, "--port", help="Passed to SGLang."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the settings and command; start nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print the settings and command as JSON."),
    extra: Optional[list[str]] = typer.Argument(
        None, metavar="[-- SGLANG_ARGS...]", show_default=False,
        help="Further launch_server arguments after `--`; a flag given here overrides Bole's."),
) -> None:
    """Serve a model with SGLang 0.5.23 as the profile decides: a Bole tree, a chain, or none."""
    from bole_cli.console import emit_json, err, out, shell_lines
    from bole_cli.errors import InputError
    from bole_cli.serving import plan_serve

    if extra and not ctx.meta.get(_DASHDASH, True):
        raise InputError(f"{extra[0]!r}: SGLang's launch_server arguments go after `--` "
                         f"(bole serve ... -- {extra[0]} ...)")
    plan = plan_serve(model, profile=profile, gpu=gpu, batch=batch, kv_len=kv_len,
                      draft_model=draft_model, steps=steps, topk=topk, draft_tokens=draft_tokens,
                      host=host, port=port, dry_run=dry_run, extra=extra,
                      chain_verify=chain_verify)
    if json_out:
        emit_json(plan.report)
    else:
        out.print(_panel(plan.report, plan.settings))
        for line in shell_lines(plan.report["command"], plan.report["env"], width=out.width, one_line=False):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    if dry_run:
        return
    if not json_out:
        err.print("starting SGLang ...", highlight=False)
    _launch(plan.argv, plan.env, stdout_to_stderr=json_out)
