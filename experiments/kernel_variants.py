"""Superseded and ablated kernels as text edits of the shipped kernels' source.

A variant is the shipped kernel (bole_cli/kernels/*.py) plus a few (old, new) replacements,
written to a temporary module and imported: nothing is copied, so a variant cannot drift
from the kernel it is measured against, and an edit that no longer applies fails loudly
instead of timing stale code. Kernel history and figures: experiments/NOTES.md; how the
kernels work: docs/design.md §2-§3. `experiments/ab_kernels.py` times a variant against
the shipped kernel.

Variants that were whole redesigns (verify v2, v4-v6, commit c1-c4) are not expressible as
small edits of today's kernels; their code is in git history (experiments/README.md). So is
the deferred commit (pending rows threaded through every verify kernel, I17-i/j): it never
won a cell `bole calibrate` decides; it was last shipped at commit 89f4d4b (removed in
83e2436; NOTES.md "Deferred commit measured").
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field

_TMP: list[str] = []  # the temporary folder of edited modules, made on first use


@dataclass(frozen=True)
class KernelSite:
    """Where a shipped @triton.jit kernel is defined and where its launcher looks it up."""

    source: str  # module whose source the edits apply to
    attr: str  # the kernel's name in it
    launcher: str  # module whose global the launch reads (patched for the A/B)


VERIFY_TILE = KernelSite("bole_cli.kernels.tree_verify_tile", "tree_verify_tile_kernel",
                         "bole_cli.kernels.tree_verify_tile")
COMMIT = KernelSite("bole_cli.kernels.tree_commit", "_tree_commit_kernel", "bole_cli.kernels.tree_commit")
VERIFY_BLOCKED = KernelSite("bole_cli.kernels.tree_verify_blocked", "tree_verify_blocked_kernel",
                            "bole_cli.kernels.tree_verify_blocked")
REPLAY = KernelSite("bole_cli.kernels.tree_commit_replay", "_tree_commit_replay_kernel",
                    "bole_cli.kernels.tree_commit_replay")
SITES = {"verify": VERIFY_TILE, "commit": COMMIT, "blocked": VERIFY_BLOCKED, "replay": REPLAY}


@dataclass(frozen=True)
class Variant:
    site: KernelSite
    about: str  # one line: what it changes, where it was measured
    edits: tuple = ()  # (old, new) text replacements of the site's source
    constexprs: dict = field(default_factory=dict)  # extra launch arguments the edits introduce
    config: dict = field(default_factory=dict)  # launch knobs of this variant only


# --- commit (shipped: c7) ---------------------------------------------------------------

# The state tile loaded before the walk (in flight during it) instead of after it.
_STATE_FIRST = (
    ("        s_old = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)\n", ""),
    ("        path_sum = accepted_path_sum(",
     "        s_old = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)\n"
     "        path_sum = accepted_path_sum("),
)
# The request's parents loaded once into registers (TN of them), the walk a reduction a level
# (the walk lives in tree_commit.accepted_path_sum: it takes the registers as two more arguments).
_PARENTS_IN_REGISTERS = (
    ("    DP: tl.constexpr, USE_L2NORM: tl.constexpr,\n):",
     "    DP: tl.constexpr, TN: tl.constexpr, USE_L2NORM: tl.constexpr,\n):"),
    ("        start, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots)\n",
     "        start, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots)\n"
     "        nodes = tl.arange(0, TN)\n"
     "        par = tl.load(parents + start + nodes, mask=nodes < (tl.load(cu + b + 1) - start),"
     " other=-1).to(tl.int32)\n"),
    ("def accepted_path_sum(acc, k, u, lp_base, parents, start, cur,",
     "def accepted_path_sum(acc, k, u, lp_base, parents, start, cur, nodes, par,"),
    ("lp_base, parents, start, a, lp_a,", "lp_base, parents, start, a, nodes, par, lp_a,"),
    ("nxt = tl.load(parents + start + cur).to(tl.int32)", "nxt = tl.sum(tl.where(nodes == cur, par, 0), axis=0)"),
)

# --- replay commit, node by node (shipped: c11) -----------------------------------------

# The state tile's load issued before the walk over the parents (in flight during it), not
# after it (NOTES.md "Replay commit, node by node": the walk and the load run one after the other).
_R_TILE = """        offs_k = tl.arange(0, KP)
        kmask = offs_k < K
        offs_v = iv * BV + tl.arange(0, BV)
        vmask = offs_v < V
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
        s = tl.load(s_ptr, mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
"""
_R_STATE_FIRST = (
    (_R_TILE, ""),
    ("        # The accepted path, deepest first, walked in registers over the request's parents\n",
     _R_TILE + "        # The accepted path, deepest first, walked in registers over the request's parents\n"),
)
# (r-gates-first, the path's gates computed once before the steps, won P-11's A/B and is
# shipped as c11; r-both, it with r-state-first, lost to it. Their edits are in git history.)

# --- verify, one-tile kernel (shipped: v7 + block merging) -----------------------------

_V8 = (("""                ainv += tl.dot(gpow, ainv, input_precision=STATE_PRECISION)
""", """                if depth == covered + 1:  # only the power G^depth itself is missing: add it
                    ainv += gpow
                else:
                    ainv += tl.dot(gpow, ainv, input_precision=STATE_PRECISION)
"""),)

# (v9, the value loop in two passes over the state slices (run 26, lost), was retired when
# the kernel's u store moved under STORE_FACTORS; its edits are in git history.)

# Ablations (wrong outputs on purpose): one stage of the tile kernel left out; the time it
# saves places that stage's cost. "no-solve" drops only the product form (depth <= 8).
_LOG_P_STORE = "            if part == 0:\n                tl.store(log_p + rows_g * s_ln + hv, lp, mask=rmask)"
_NO_SOLVE = (("while covered < depth:", "while covered < 0:"),)
_NO_WALK = (("while tl.max(cur, axis=0) >= 0:", "while tl.max(cur, axis=0) >= 1 << 30:"),)
_NO_GRAM = (("        for kb in range(0, KP, BK):\n            offs = kb + tl.arange(0, BK)\n            m2",
             "        for kb in range(0, 0, BK):\n            offs = kb + tl.arange(0, BK)\n            m2"),)
_NO_STATE = (("            for kb in range(0, KP, BK):", "            for kb in range(0, 0, BK):"),)
_NO_VALUES = (("for vt in range(0, VT, BV):\n            offs_v = part",
               "for vt in range(0, 0, BV):\n            offs_v = part"),
              # keep the factors alive, or the compiler drops the work that builds them
              (_LOG_P_STORE, _LOG_P_STORE.replace(
                  "lp, mask", "lp + 0.0 * (tl.sum(ce, axis=1) + tl.sum(ainv, axis=1)), mask")))

# --- verify, blocked kernel (shipped: v10; trees of 65-256 nodes) ------------------------

# Ablations as above, of the blocked kernel (issue 17, run I17-h): which stage holds its time.
_B_NO_PAIRS = (("        for c2 in range(0, c):\n", "        for c2 in range(0, 0):\n"),)
_B_NO_DIAG = (("            kk = _gram(k, k, rows_g, rmask, h, s_kn, s_kh, s_kn, s_kh, K, KP, BC, BK, PRECISION, GRAM16)\n",
               "            kk = tl.zeros([BC, BC], dtype=tl.float32)\n"),
              ("            qk = _gram(q, k, rows_g, rmask, h, s_qn, s_qh, s_kn, s_kh, K, KP, BC, BK, PRECISION, GRAM16)\n",
               "            qk = tl.zeros([BC, BC], dtype=tl.float32)\n"),
              ("            while covered < depth:\n", "            while covered < 0:\n"))
# (b-no-walk, b-state-only and b-no-state, I17-h, edited the walk and the state products
# inline in v10; they moved into tree_verify_parts.ancestor_words / state_products with
# SPLIT (I17-k), so they were retired: their records stay in results/i17-big/ablate.json
# and ablate-no-state.json, their edits in git history.)

VARIANTS: dict[str, Variant] = {
    "r-state-first": Variant(REPLAY, "c11 with the state tile loaded before the walk (on c10: 0-7% slower, "
                             "P-11)", _R_STATE_FIRST),
    "c8": Variant(COMMIT, "c7 with the request's parents in registers, the walk a reduction a level (run 22)",
                  _PARENTS_IN_REGISTERS, {"TN": 256}),
    "c8p": Variant(COMMIT, "c8 with the state tile loaded before the walk (run 22)",
                   _PARENTS_IN_REGISTERS + _STATE_FIRST, {"TN": 256}),
    "cA": Variant(COMMIT, "c7 with the state tile loaded before the walk (run 13's cA, made from c4 then)",
                  _STATE_FIRST),
    "v8": Variant(VERIFY_TILE, "last product-form step adds G^depth when depth = covered + 1 (run 23)", _V8),
    "gram-tf32": Variant(VERIFY_TILE, "Gram terms on tf32 operands instead of bf16 (GRAM16 off; run 11)",
                         config={"GRAM16": 0}),
    "no-walk": Variant(VERIFY_TILE, "ablation: no ancestor walk (and so no solve: depth 0)", _NO_WALK),
    "no-solve": Variant(VERIFY_TILE, "ablation: no product-form solve", _NO_SOLVE),
    "no-gram": Variant(VERIFY_TILE, "ablation: no Gram terms", _NO_GRAM),
    "no-state": Variant(VERIFY_TILE, "ablation: no products with the state", _NO_STATE),
    "b-no-pairs": Variant(VERIFY_BLOCKED, "ablation: no chunk pairs (earlier chunks' G U and C U)", _B_NO_PAIRS),
    "b-no-diag": Variant(VERIFY_BLOCKED, "ablation: no diagonal Gram blocks and no product-form solve",
                         _B_NO_DIAG),
    "b-split": Variant(VERIFY_BLOCKED, "the tree stage of SPLIT (state products and Gram terms read from "
                       "workspaces; I17-k)", config={"SPLIT": 1}),
    "no-values": Variant(VERIFY_TILE, "ablation: no value loop (state products, solves' products, stores)",
                         _NO_VALUES),
}


def edited_source(site: KernelSite, edits) -> str:
    """The site module's source with every (old, new) edit applied; each must match."""
    src = inspect.getsource(importlib.import_module(site.source))
    for old, new in edits:
        if old not in src:
            raise ValueError(f"{site.source}: edit no longer applies, text not found:\n{old}")
        src = src.replace(old, new)
    return src


def load_variant(name: str):
    """The edited kernel of VARIANTS[name] (a @triton.jit function), from a temporary module."""
    variant = VARIANTS[name]
    if not variant.edits:  # a launch-knob variant: the shipped kernel itself
        return getattr(importlib.import_module(variant.site.source), variant.site.attr)
    if not _TMP:
        _TMP.append(tempfile.mkdtemp(prefix="bole-variants-"))
    path = os.path.join(_TMP[0], f"variant_{name.replace('-', '_')}.py")
    with open(path, "w") as f:
        f.write(edited_source(variant.site, variant.edits))
    spec = importlib.util.spec_from_file_location(f"variant_{name.replace('-', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, variant.site.attr)


@contextmanager
def kernel_in_place(site: KernelSite, kernel):
    """The launcher reads `kernel` while inside (CUDA graphs keep what was captured)."""
    launcher = importlib.import_module(site.launcher)
    shipped = getattr(launcher, site.attr)
    setattr(launcher, site.attr, kernel)
    try:
        yield
    finally:
        setattr(launcher, site.attr, shipped)
