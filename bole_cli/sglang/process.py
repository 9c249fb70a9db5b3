"""The Bole plug-in in this process: its role in SGLang, its state, its log.

SGLang loads plug-ins in every process that calls ``load_plugins()``; the hooks are
registered only where a scheduler runs (`process_role`, docs/design.md §6). `state` says
whether the plug-in is active here and, if not, why; `hooks_missing` whether SGLang's
HookRegistry patched every hook. The activation (`plugin`), the sizing and the hooks share
them. Standard library only at import time.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from bole_cli.sglang.targets import HOOKS

logger = logging.getLogger("bole_cli.sglang.plugin")

# Frames (module, function) that mark a process running an SGLang scheduler.
SCHEDULER_FRAMES: tuple[tuple[str, str], ...] = (
    ("sglang.srt.managers.scheduler", "run_scheduler_process"),
    ("bole_cli.sglang.plugin", "ray_worker_setup"),
)
LOADER_FRAME = ("sglang.srt.plugins", "load_plugins")

state: dict[str, Any] = {"active": False, "reason": "not activated"}
logged: set[str] = set()


def log_once(level: int, message: str, *args: Any) -> None:
    """Log a message once per process (the hooks run per layer and per batch)."""
    key = message % args if args else message
    if key not in logged:
        logged.add(key)
        logger.log(level, message, *args)


def truthy(value: Optional[str]) -> bool:
    """An environment flag's value: set unless empty, 0, false or no."""
    return (value or "").strip().lower() not in ("", "0", "false", "no")


def call_stack() -> list[tuple[str, str]]:
    """(module, function) of each frame from the caller outwards."""
    frame, out = sys._getframe(1), []
    while frame is not None:
        out.append((str(frame.f_globals.get("__name__", "")), frame.f_code.co_name))
        frame = frame.f_back
    return out


def process_role(frames: Optional[list[tuple[str, str]]] = None) -> str:
    """"scheduler" where an SGLang scheduler runs (`SCHEDULER_FRAMES` on the stack);
    "other" where SGLang's loader runs without one (launcher, DP controller, detokenizer):
    no hooks there; "direct" when called outside SGLang's loader (tests, embedding)."""
    frames = call_stack() if frames is None else frames
    if any(f in SCHEDULER_FRAMES for f in frames):
        return "scheduler"
    return "other" if LOADER_FRAME in frames else "direct"


def hooks_missing() -> list[str]:
    """Bole's hook targets that SGLang's HookRegistry did not patch (all or nothing: a pool
    without snapshots needs every hook). Empty when the registry is not loaded (tests)."""
    registry_mod = sys.modules.get("sglang.srt.plugins.hook_registry")
    registry = getattr(registry_mod, "HookRegistry", None)
    patched = getattr(registry, "_patched", None)
    if registry is None or not state["active"]:
        return [] if registry is None else ["the plug-in is not active"]
    if not isinstance(patched, (set, frozenset)):
        return ["HookRegistry._patched (cannot tell which hooks applied)"]
    return [h.target for h in HOOKS if h.target not in patched]
