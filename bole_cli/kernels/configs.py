"""Kernel launch configurations: built-in defaults, overridable by tuned tables.

`bole tune-kernels` stores the best configuration per (device, Triton version, kernel,
shape bucket); `launch_config` returns it when one is registered, else the default.
Keeping the lookup here means the kernels never read files themselves.
"""

from __future__ import annotations

from typing import Callable, Optional

DEFAULTS: dict[str, dict] = {
    # BC: node chunk of the blocked solve; BV: value tile; BK: key-dim slice of the dots;
    # warps and stages as Triton's;
    # precision of tree_verify's dots (None: by activation dtype, see tree_verify).
    "tree_verify": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 4, "num_stages": 1, "precision": None},
    "tree_commit": {"BV": 32, "num_warps": 4, "num_stages": 1},
    "tree_conv": {"BN": 16, "BD": 128, "num_warps": 4, "num_stages": 1},
}

# A resolver maps (kernel, shape dict) to a config dict or None; set by the tuner's loader.
_resolver: Optional[Callable[[str, dict], Optional[dict]]] = None


def set_resolver(fn: Optional[Callable[[str, dict], Optional[dict]]]) -> None:
    global _resolver
    _resolver = fn


def _verify_rule(shape: dict) -> dict:
    """tree_verify's built-in choice, from an H200 grid over BC x BV x warps (bench/NOTES.md):
    enough programs to fill the GPU first (value tiles of 32 at batch 1), then the smallest
    node chunk (the product-form solve costs grow with BC); long trees at small batch are
    latency-bound and prefer fewer, larger chunks."""
    lanes = shape.get("B", 1) * shape.get("HV", 1)  # programs per value tile
    avg_nodes = shape.get("N", 0) / max(shape.get("B", 1), 1)
    if lanes < 256 and avg_nodes >= 48:
        return {"BC": 64, "BV": 32 if lanes <= 32 else 128}
    return {"BC": 16, "BV": 128 if lanes >= 256 else (64 if lanes >= 128 else 32)}


def launch_config(kernel: str, shape: dict, override: Optional[dict] = None) -> dict:
    cfg = dict(DEFAULTS[kernel])
    if kernel == "tree_verify":
        cfg.update(_verify_rule(shape))
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
