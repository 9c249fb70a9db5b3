"""The search space of each kernel's launch configuration.

The knobs are a value tile b_v, a key chunk b_k, warps, stages and a solver variant;
our kernels name them as their config keys (the ones `launch_config` returns and
`config=` overrides), so the tuner uses those names:

    tree_verify  VSPLIT  programs per value head (one-tile kernel, trees <= 64 nodes)
                 BC  node chunk of the blocked kernel (trees > 64 nodes; the solver-variant
                     knob: the size of the triangular blocks)
                 BV  value tile ("b_v")
                 BK  key-dim slice of the dots ("b_k")
    tree_commit_replay  BV  value tile (the served commit)
    tree_commit  BV  value tile (Eq. 10 from the verify's factors: `bole bench kernels`' tables
                 baseline, no longer served)
    tree_conv    BN  node block,  BD  channel block
    all          num_warps, num_stages (Triton's)

`precision` (tree_verify's dot precision) is deliberately NOT searched: it changes the
numerics, not only the speed. Values above the padded dimension collapse onto the same
launch (the kernels clamp BV to next_pow2(V)), so they are dropped per shape.
Configurations that do not compile or exceed shared memory are not filtered here: the
tuner finds out by compiling them and skips them (bole_cli.tuning.checks).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from typing import Mapping, Optional

KERNELS = ("tree_verify", "tree_commit_replay", "tree_conv", "tree_commit")

# Full value lists per kernel; narrowed per shape by `search_space`. The keys are the ones a
# tuned table may set (bole_cli.kernels.tuned_tables.TUNED_KEYS; tests/test_tuning.py checks).
SPACES: dict[str, dict[str, tuple[int, ...]]] = {
    # tree_verify: VSPLIT is searched on trees <= 64 nodes, BC on larger ones (study.py).
    "tree_verify": {"BC": (16, 32, 64), "VSPLIT": (1, 2, 4), "BV": (16, 32, 64, 128),
                    "BK": (16, 32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2)},
    # the replay commit holds a [BV, K] state tile in registers: BV 128 on one warp spills
    "tree_commit_replay": {"BV": (16, 32, 64), "num_warps": (1, 2, 4), "num_stages": (1, 2)},
    "tree_commit": {"BV": (16, 32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
    "tree_conv": {"BN": (16, 32, 64), "BD": (64, 128, 256, 512),
                  "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
}


def _next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def check_kernel(kernel: str) -> str:
    if kernel not in SPACES:
        from bole_cli.errors import InputError

        raise InputError(f"unknown kernel {kernel!r}; tunable: {', '.join(KERNELS)}")
    return kernel


def search_space(kernel: str, dims: Mapping[str, int],
                 include: Optional[Mapping[str, int]] = None) -> dict[str, list[int]]:
    """Candidate values per config key for one model shape.

    dims: the kernel's model dimensions (V, K for tree_verify and the commits, D for tree_conv;
    others are ignored). `include` (usually the built-in default) is always kept in, so
    the default is a point of the space and can be timed in the same study; when given,
    only its keys are searched (a key the kernel no longer takes drops out by itself).
    """
    check_kernel(kernel)
    space = {k: list(v) for k, v in SPACES[kernel].items()}
    if "BV" in space and "V" in dims:
        cap = _next_pow2(dims["V"])
        space["BV"] = [v for v in space["BV"] if v <= cap] or [min(space["BV"])]
    if "BK" in space and "K" in dims:
        cap = _next_pow2(dims["K"])
        space["BK"] = [v for v in space["BK"] if v <= cap] or [min(space["BK"])]
    if "BD" in space and "D" in dims:
        cap = _next_pow2(dims["D"])
        space["BD"] = [v for v in space["BD"] if v <= cap] or [min(space["BD"])]
    if include is not None:
        space = {k: v for k, v in space.items() if k in include}
        for key, value in include.items():
            if key in space and int(value) not in space[key]:
                space[key] = sorted(space[key] + [int(value)])
    return space


def space_size(space: Mapping[str, list]) -> int:
    n = 1
    for values in space.values():
        n *= len(values)
    return n


def candidates(space: Mapping[str, list]) -> list[dict[str, int]]:
    """Every configuration of the space, in a stable (lexicographic) order."""
    keys = list(space)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(space[k] for k in keys))]


def sample_candidates(space: Mapping[str, list], n: int, seed: int = 0,
                      first: Optional[Mapping[str, int]] = None) -> list[dict[str, int]]:
    """n distinct configurations: `first` (e.g. the default) then a seeded random draw."""
    pool = candidates(space)
    out: list[dict[str, int]] = []
    if first is not None:
        head = {k: int(first[k]) for k in space}
        out.append(head)
        pool = [c for c in pool if c != head]
    random.Random(seed).shuffle(pool)
    out.extend(pool[: max(n - len(out), 0)])
    return out[:n]


def space_fingerprint(kernel: str, space: Mapping[str, list]) -> str:
    """A short hash naming the space, so a study never mixes two different spaces."""
    text = json.dumps([kernel, {k: list(v) for k, v in space.items()}], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def format_config(cfg: Optional[Mapping[str, int]]) -> str:
    """'BC16 BV64 w4 s1' style, short enough for a table cell."""
    if not cfg:
        return "-"
    short = {"num_warps": "w", "num_stages": "s"}
    return " ".join(f"{short.get(k, k)}{v}" for k, v in cfg.items())
