"""Bole's SGLang 0.5.23 plug-in (entry point ``bole`` in group ``sglang.srt.plugins``).

SGLang calls `activate` in every process that runs ``load_plugins()`` (the launcher, each
scheduler, the DP controller, the detokenizer). It registers six AROUND hooks with
``sglang.srt.plugins.hook_registry.HookRegistry`` (`HOOKS`) only where a scheduler runs
(`process_role`): registering makes ``apply_hooks`` import the attention and model-runner
stack, which the other processes never need. It accepts SGLang 0.5.23 and its post
releases whose hooked names and source facts still check out against their source
(`version_problem`); on any other version it logs one line and registers nothing. Under
SGLang's Ray launcher the scheduler actors never call ``load_plugins()``: `ray_worker_setup`
is the Ray ``worker_process_setup_hook`` that makes them load it, and the launcher logs
that it is needed (docs/sglang-0.5.23.md (c)). The hooks touch only hybrid Gated-DeltaNet models served
with an EAGLE-family draft: a tree (``--speculative-eagle-topk > 1``) or a chain (top-k 1,
the tree whose parents are 0..D-2; ``BOLE_CHAINS=0`` leaves chains to SGLang); every other
path (prefill, decode, other models, ReplaySSM, PD disaggregation, ...) reaches SGLang's
own code unchanged. Per pool, the decision and its reason are logged once.

This module is the activation (docs/design.md §6): the version gate, the process role and
the Ray hook. The sizing of the pool and the budget is in `sizing`, the AROUND hooks in
`hooks`, every SGLang name they hook or read (and its source check) in `targets`.
This module imports only the standard library (and Bole's light modules) at import time.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Optional

from bole_cli.sglang.plan import ENV_CHAINS, ENV_DISABLE, chains_enabled, plugin_disabled
from bole_cli.sglang import process
from bole_cli.sglang.source import SGLANG_VERSION
from bole_cli.sglang.targets import HOOKS, check_plugin_targets


PLUGIN_NAME = "bole"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT = "bole_cli.sglang.plugin:activate"

_POST_RELEASE = re.compile(re.escape(SGLANG_VERSION) + r"\.post\d+")

def sglang_version() -> Optional[str]:
    """The running SGLang's version (its own module first, then package metadata)."""
    mod = sys.modules.get("sglang.version") or sys.modules.get("sglang")
    ver = getattr(mod, "__version__", None)
    if isinstance(ver, str):
        return ver
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - no metadata: try importing its version module
        pass
    try:
        from sglang.version import __version__  # type: ignore[import-not-found]

        return str(__version__)
    except Exception:  # noqa: BLE001
        return None


def activate() -> bool:
    """The entry point SGLang calls (zero arguments). True when the hooks are registered."""
    return _activate(sglang_version())


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` for SGLang's Ray launcher (``--use-ray``): its
    scheduler actors (srt/ray/scheduler_actor.py) never call ``load_plugins()``, so Ray
    must; ``ray.init(runtime_env={"worker_process_setup_hook":
    "bole_cli.sglang.plugin.ray_worker_setup"})``."""
    from sglang.srt.plugins import load_plugins  # type: ignore[import-not-found]

    load_plugins()


def uses_ray_launcher(frames: list[tuple[str, str]], argv: list[str]) -> bool:
    """SGLang's Ray launcher: ``--use-ray`` on the command line, or RayEngine on the stack."""
    return (any(a == "--use-ray" or a.startswith("--use-ray=") for a in argv)
            or any(m.startswith("sglang.srt.ray.") for m, _ in frames))


def version_problem(version: Optional[str], source: Any = None) -> str:
    """"" when the plug-in may run on this SGLang version, else why not (one line): 0.5.23,
    or a post release of it whose hooked names and source facts all check out."""
    if version == SGLANG_VERSION:
        return ""
    if not version or not _POST_RELEASE.fullmatch(version):
        return f"SGLang {version or 'of unknown version'}"
    try:
        if source is None:
            from bole_cli.sglang.source import find_sglang_source

            source = find_sglang_source(None, version=version)
        problems = check_plugin_targets(source)
    except Exception as exc:  # noqa: BLE001 - cannot check: stay out
        problems = [f"its source could not be checked ({type(exc).__name__}: {exc})"]
    if not problems:
        return ""
    return f"SGLang {version} ({len(problems)} hook check(s) fail; first: {problems[0]})"


def _activate(version: Optional[str], registry: Any = None, hook_type: Any = None,
              environ: Optional[dict] = None, *, frames: Optional[list[tuple[str, str]]] = None,
              argv: Optional[list[str]] = None, source: Any = None) -> bool:
    env = os.environ if environ is None else environ
    if process.state["active"]:
        return True
    if plugin_disabled(env.get(ENV_DISABLE)):
        process.state["reason"] = f"{ENV_DISABLE} is set"
        process.logger.warning("Bole plug-in: %s; staying inactive (SGLang runs unchanged)",
                               process.state["reason"])
        return False
    if version != SGLANG_VERSION and not (version and _POST_RELEASE.fullmatch(version)):
        return _refuse_version(version, version_problem(version))
    frames = process.call_stack() if frames is None else frames
    if process.process_role(frames) == "other":
        process.state["reason"] = "no SGLang scheduler in this process"
        if uses_ray_launcher(frames, sys.argv if argv is None else argv):
            process.logger.warning("Bole plug-in: SGLang's Ray launcher: its scheduler actors do not load "
                           "plug-ins, so Bole is inactive there unless Ray runs %s.ray_worker_setup "
                           "as its worker_process_setup_hook (README)", __name__)
        else:
            process.logger.info("Bole plug-in: no SGLang scheduler in this process; hooks are applied "
                        "in the scheduler processes only")
        return False
    why = version_problem(version, source)
    if why:
        return _refuse_version(version, why)
    if registry is None or hook_type is None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore

        registry, hook_type = HookRegistry, HookType
    from bole_cli.sglang import hooks

    for hook in HOOKS:
        registry.register(hook.target, getattr(hooks, hook.function), hook_type.AROUND)
    process.state.update(active=True, reason="")
    chains = {True: "trees and chains", False: f"trees only ({ENV_CHAINS}=0: chains keep SGLang's path)",
              None: f"trees only ({ENV_CHAINS}={env.get(ENV_CHAINS)!r} is not 1 or 0)"}
    process.logger.info("Bole plug-in: active on SGLang %s (%d hooks); the verify of Gated DeltaNet layers "
                "uses Bole's closed form and factorised commit for %s", version, len(HOOKS),
                chains[chains_enabled(env.get(ENV_CHAINS))])
    return True


def _refuse_version(version: Optional[str], why: str) -> bool:
    process.state["reason"] = why
    process.logger.warning("Bole plug-in: found %s but Bole is pinned to SGLang %s; staying "
                   "inactive (SGLang runs unchanged; pip install \"sglang==%s\")",
                   why if version else "SGLang (version unknown)", SGLANG_VERSION, SGLANG_VERSION)
    return False


