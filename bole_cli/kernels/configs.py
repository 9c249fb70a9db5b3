"""Kernel launch configurations (docs/design.md §3): built-in defaults and rules,
overridden by the GPU's tuned table, then by an explicit `config=`.

`bole tune-kernels` stores the best configuration per (device, Triton version, kernel,
shape bucket); `launch_config` applies it through the lookup beside it
(`kernels/tuned_tables.py`), so the kernels never read files themselves.
"""

from __future__ import annotations

from typing import Optional

from bole_cli.errors import InputError
from bole_cli.kernels.tuned_tables import notice, tuned_config
from bole_cli.kernels.validate import check_config
from bole_cli.kernels.verify_path import is_tile_launch

TABLES_PRECISION = "tf32"  # the verify's dots when `bole tune-kernels` tunes it (bf16 inputs)

DEFAULTS: dict[str, dict] = {
    # BV: value tile; BK: key-dim slice of the dots; VSPLIT: programs sharing a value head
    # (one-tile kernel, trees <= 64 nodes); BC: node chunk (blocked kernel, larger trees);
    # warps and stages as Triton's; precision of the dots (None: by activation dtype);
    # GRAM16: 16-bit inputs' Gram products on 16-bit operands (exact; one-tile kernel).
    # CHAIN: past one tile, long chains take the chain kernel (0: the blocked kernel for all).
    # SPLIT: the blocked kernel's state products and Gram terms in launches of their own
    # before it (1). LEVELS: past one tile, trees of known depth below CHAIN_KERNEL_DEPTH take the level kernel (1;
    # RB, its products launch's rows, and BV / BK / warps / stages by levels_launch_config).
    "tree_verify": {"BV": 32, "BK": 32, "VSPLIT": 1, "BC": 32, "num_warps": 4, "num_stages": 1,
                    "precision": None, "GRAM16": 1, "CHAIN": 1, "SPLIT": 0, "LEVELS": 0, "RB": 64},
    "tree_commit": {"BV": 64, "DP": 16, "num_warps": 4, "num_stages": 1},  # DP: path nodes a pass
    # the served commit (docs/design.md §9), node by node: value tiles of BV on one warp won
    # 11 of 12 cells on the H200 (experiments/results/precision/ab-replay-v4.json)
    "tree_commit_replay": {"BV": 16, "num_warps": 1, "num_stages": 1},
    # tree_conv: BN16 BD64 w4 s2 won 22 of the 24 tree_conv buckets on the H200 by 1.1-1.3x
    # (bole tune-kernels, experiments/results/tune-kernels-h200.json); it was BD128 s1
    "tree_conv": {"BN": 16, "BD": 64, "num_warps": 4, "num_stages": 2},
    # BN weight rows a program, BK its K tile, SPLIT_K slices of K (skinny_mm_launch_config)
    "skinny_mm": {"BN": 32, "BK": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4},
}


def _verify_rule(shape: dict) -> dict:
    if is_tile_launch(shape):
        return _verify_tile_rule(shape)
    return _verify_blocked_rule(shape)


def _verify_tile_rule(shape: dict) -> dict:
    """One-tile kernel, from the H200 grid (experiments/results/sweep-v4-h200.json): split a value
    head over 4 programs at batch 1 and 2 at batch 4 (the tree work repeated per program
    costs nothing while SMs are idle), one program per head beyond; 64-wide key slices,
    4 warps (8 lose everywhere: the [T, T] factors are replicated per warp)."""
    lanes = shape.get("B", 1) * shape.get("HV", 1)
    if lanes <= 32:
        return {"BV": 32, "BK": 64, "VSPLIT": 4, "num_warps": 4}
    return {"BV": 64, "BK": 64, "VSPLIT": 2 if lanes <= 128 else 1, "num_warps": 4}


def _verify_blocked_rule(shape: dict) -> dict:
    """tree_verify's blocked kernel. Trees of 65-256 nodes (H200 A/B, experiments/README.md I17-k;
    experiments/results/i17-big/, NOTES.md "Big trees, fifth session"): SPLIT, the ancestor
    walk, state products and Gram terms in one wide launch first, then the tree stage on
    chunks of 32 with whole value heads, on 8 warps below 512 request-heads (batch 16 at 9B)
    and 4 from there: 1.28-1.57x faster than the whole kernel from batch 4, 1.02-1.04x at batch 1.
    Smaller trees (size not promised) keep the rule measured on the v3 kernel
    (sweep-verify-v2-v3-h200.json)."""
    lanes = shape.get("B", 1) * shape.get("HV", 1)  # programs per value tile
    avg_nodes = shape.get("N", 0) / max(shape.get("B", 1), 1)
    if avg_nodes > 64:
        # trees of known depth below CHAIN_KERNEL_DEPTH: level by level up to 64 request-heads
        # (batch 1-2 at 9B), and up to 128 past 192 nodes, where it beat SPLIT on the H200
        # (I17-m, NOTES.md "Big trees, sixth session")
        return {"BC": 32, "BV": 128, "BK": 32, "num_warps": 8 if lanes < 512 else 4, "SPLIT": 1,
                "LEVELS": int(lanes <= 64 or (lanes <= 128 and avg_nodes > 192))}
    if lanes <= 32:
        return {"BC": 32, "BV": 32, "BK": 32, "num_warps": 4}
    bc = 16 if avg_nodes < 32 else 32
    return {"BC": bc, "BV": 32 if lanes < 512 else 64, "BK": 64 if bc == 16 and lanes < 512 else 32,
            "num_warps": 2}


def chain_launch_config(lanes: int) -> dict:
    """tree_verify's chain kernels (chains past one tile), by request-heads `lanes`: from the
    H200 A/B, I17-l (experiments/results/i17-big/ab-chain13.json; NOTES.md "Big trees,
    sixth session"): chunks of 32 and value tiles of 32 up to 32 request-heads (a single 9B
    request), chunks of 16 and value tiles of 64 beyond, on 4 warps (its factors launch on
    4 too: factor_warps). Not tuned per GPU: the rule is the measured best or within 1% of
    it at every cell."""
    if lanes <= 32:
        return {"BC": 32, "BV": 32, "num_warps": 4, "num_stages": 1, "factor_warps": 4}
    return {"BC": 16, "BV": 64, "num_warps": 4, "num_stages": 1, "factor_warps": 4}


def levels_launch_config(tp: int) -> dict:
    """tree_verify's level kernel (shallow trees past one tile), by its rows TP: value tiles
    of 32, key slices of 64, 4 warps up to 128 rows and 8 beyond (H200, I17-m: the best or
    within 4% of it at batch 1-2). Its products launch takes RB rows a program
    (tree_verify's RB) on gram_warps warps."""
    return {"BV": 32, "BK": 64, "num_warps": 4 if tp <= 128 else 8, "num_stages": 1, "gram_warps": 8}


# SPLIT's parts (tree_verify_parts.py), not tuned per GPU: the state products' rows, value
# columns and key slice a program, the Gram tile, the launch's warps and stages, the roles
# it runs (all three; fewer only to time them apart) (H200, I17-k: NOTES.md "Big trees")
PARTS_LAUNCH = {"BR": 64, "BV": 64, "BK": 32, "BG": 64, "num_warps": 4, "num_stages": 3, "ROLES": 7}


# the replay commit's long paths (tree_commit_replay_passes.py), not tuned per GPU: value
# tiles of 32 (16 for a single request), DP path nodes a pass, 4 warps (H200, P-2: the best
# or within 7% of it in 6 of 8 cells)
REPLAY_PASSES_LAUNCH = {"BV": 32, "DP": 16, "num_warps": 4, "num_stages": 1}


def skinny_mm_launch_config(shape: dict) -> dict:
    """kernels.skinny_mm, by its output columns N, depth K and the GPU's SMs (SMS): 32 weight
    rows a program; K split in two, four, ... until the programs fill two waves, keeping at
    least 1024 of K a slice; 128-wide K tiles on 4 warps, 4 stages in flight. On the H200
    at one row (R-12's grid, experiments/results/components/skinny-9b-r12.json) that is
    within 2% of the best of 24 configs at every 9B shape; 16 rows a program, which the
    rule took for narrow outputs before, was never the best (the rule's configs then: out_proj
    17.4 against 16.7 us now, the MLP's down projection 36.9 against 33.3)."""
    n, k, sms = shape["N"], shape["K"], shape["SMS"]  # (M only sizes the tensor-core tile)
    bn = 32
    split = 1
    while -(-n // bn) * split < 2 * sms and k // (2 * split) >= 1024:
        split *= 2
    return {"BN": bn, "BK": 128, "SPLIT_K": split, "num_warps": 4, "num_stages": 4}


def launch_config(kernel: str, shape: dict, override: Optional[dict] = None) -> dict:
    check_config(kernel, override)  # a value the kernel cannot compile: one line naming `config`
    cfg = dict(DEFAULTS[kernel])
    if kernel == "tree_verify":
        cfg.update(_verify_rule(shape))
    elif kernel == "skinny_mm":
        cfg.update(skinny_mm_launch_config(shape))
    elif kernel == "tree_commit" and shape.get("B", 1) * shape.get("HV", 1) * shape.get("L", 1) <= 32:
        cfg["BV"] = 16  # a single request: more, smaller tiles (H200: 8.9 vs 13.5 us at BV 32)
    # the tables are tuned at the served precision (the tuner's bf16 verify: tf32, docs/design.md
    # §9), and split keeps them (its readout is tf32, its launch the same one-tile kernel's:
    # timed against tf32 on the same configs); a launch at another precision keeps the rules
    asked = (override or {}).get("precision")
    tuned = tuned_config(kernel, shape) if asked in (None, TABLES_PRECISION, "split") else None
    if tuned:
        try:
            check_config(kernel, tuned)
        except InputError as exc:  # a hand-edited table must never break a launch
            notice(f"a tuned {kernel} entry was ignored ({exc})")
        else:
            cfg.update(tuned)
    if override:
        unknown = set(override) - set(cfg)
        if unknown:
            raise InputError(f"config: unknown keys {sorted(unknown)} for {kernel} (known: {sorted(cfg)})")
        cfg.update(override)
    return cfg
