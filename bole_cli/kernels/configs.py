"""Kernel launch configurations: built-in defaults, overridable by tuned tables.

`bole tune-kernels` stores the best configuration per (device, Triton version, kernel,
shape bucket); `launch_config` returns it when one is registered, else the default.
Keeping the lookup here means the kernels never read files themselves.
"""

from __future__ import annotations

from typing import Callable, Optional

DEFAULTS: dict[str, dict] = {
    # BC: node chunk of the blocked solve; BV: value tile; warps and stages as Triton's.
    "tree_verify": {"BC": 32, "BV": 64, "num_warps": 4, "num_stages": 1, "precision": "tf32"},
    "tree_commit": {"BV": 32, "num_warps": 4, "num_stages": 1},
    "tree_conv": {"BN": 16, "BD": 128, "num_warps": 4, "num_stages": 1},
}

# A resolver maps (kernel, shape dict) to a config dict or None; set by the tuner's loader.
_resolver: Optional[Callable[[str, dict], Optional[dict]]] = None


def set_resolver(fn: Optional[Callable[[str, dict], Optional[dict]]]) -> None:
    global _resolver
    _resolver = fn


def launch_config(kernel: str, shape: dict, override: Optional[dict] = None) -> dict:
    cfg = dict(DEFAULTS[kernel])
    if _resolver is not None:
        tuned = _resolver(kernel, shape)
        if tuned:
            cfg.update(tuned)
    if override:
        unknown = set(override) - set(cfg)
        if unknown:
            raise InputError(f"config: unknown keys {sorted(unknown)} for {kernel} (known: {sorted(cfg)})")
        cfg.update(override)
    return cfg
