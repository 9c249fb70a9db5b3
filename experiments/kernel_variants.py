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
# the attention's launcher (its kernels come with it: a variant edits the module around it)
ATTENTION = KernelSite("bole_cli.kernels.cache_attention", "cache_attention", "bole_cli.kernels.cache_attention")
DECODE = KernelSite("bole_cli.kernels.gdn_decode", "_gdn_decode_kernel", "bole_cli.kernels.gdn_decode")
SITES = {"verify": VERIFY_TILE, "commit": COMMIT, "blocked": VERIFY_BLOCKED, "replay": REPLAY, "decode": DECODE,
         "attention": ATTENTION}
# the replay commit's launcher (its route between the node-by-node and the passes kernels):
# ab_kernels.py runs these variants as replay variants
REPLAY_ROUTE = KernelSite("bole_cli.kernels.tree_commit_replay", "_replay", "bole_cli.kernels.tree_commit_replay")


@dataclass(frozen=True)
class Variant:
    site: KernelSite
    about: str  # one line: what it changes, where it was measured
    edits: tuple = ()  # (old, new) text replacements of the site's source, or (first, last, new):
    # the span from the line `first` through `last`, both included, replaced
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
    ("        start, _, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)\n",
     "        start, n_nodes, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)\n"
     "        nodes = tl.arange(0, TN)\n"
     "        par = tl.load(parents + start + nodes, mask=nodes < n_nodes, other=-1).to(tl.int32)\n"),
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
        row_stride = SV if SV else s_sv  # SV: the launch's constant row stride, where it sets one
        s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * row_stride + offs_k[None, :]
        s = tl.load(s_ptr, mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
"""
_R_STATE_FIRST = (
    (_R_TILE, ""),
    ("        # The accepted path, deepest first, walked in registers over the request's parents\n",
     _R_TILE + "        # The accepted path, deepest first, walked in registers over the request's parents\n"),
)
# The k norm and the decay folded into the step's vectors, not applied to the row and the
# tile first: k . S on the raw row and the row's norm are two independent reductions (the
# shipped step does them one after the other), and the decay rides the update (s e + u k^T)
# instead of its own pass over the tile. Same arithmetic to float32 rounding.
_R_STEP = """            if USE_L2NORM:
                kt = kt / tl.sqrt(tl.sum(kt * kt, axis=0) + 1e-6)
            s = s * tl.exp(gt)
            ut = bt * (vt - tl.sum(s * kt[None, :], axis=1))
            s = s + ut[:, None] * kt[None, :]
"""
_R_FOLD_NORM = ((_R_STEP, """            rn = tl.sum(kt * kt, axis=0) * 0.0 + 1.0
            if USE_L2NORM:
                rn = 1.0 / tl.sqrt(tl.sum(kt * kt, axis=0) + 1e-6)
            et = tl.exp(gt)
            ut = bt * (vt - (et * rn) * tl.sum(s * kt[None, :], axis=1))
            s = s * et + (ut * rn)[:, None] * kt[None, :]
"""),)
# Two path nodes a step: both rows' k . S taken from the same tile (independent reductions),
# the second node's u corrected by the first's through k0 . k1 (the chain's 2 x 2 system),
# one update with both rank-1 terms. Half the dependent steps of the shipped walk; the
# next pair's rows loaded a step ahead. A pair past the path's end has zero rows (u = 0).
_R_ROWS_FN = """@triton.jit
def _replay_rows(k_base, v_base, g_base, b_base, path, dist, start, at, offs_k, offs_v, s_kn, s_vn, hv, s_gn,
                 s_bn, neg_a, bias, g_all, b_all, K: tl.constexpr, V: tl.constexpr, GATED: tl.constexpr,
                 GATES_FIRST: tl.constexpr):
    row = start + tl.sum(tl.where(at, path, 0), axis=0)
    n = tl.sum(at.to(tl.int32), axis=0)
    kr = tl.load(k_base + row * s_kn, mask=offs_k < K * n, other=0.0).to(tl.float32)
    vr = tl.load(v_base + row * s_vn, mask=offs_v < V * n, other=0.0).to(tl.float32)
    if GATES_FIRST:
        gr = tl.sum(tl.where(at, g_all, 0.0), axis=0)
        br = tl.sum(tl.where(at, b_all, 0.0), axis=0)
    else:
        gr, br = row_gates(g_base, b_base, row, n > 0, hv, s_gn, 1, s_bn, 1, neg_a, bias, GATED, True)
    return kr, vr, gr, br


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def _tree_commit_replay_kernel(
"""
# the shipped walk's steps, from the root's row to the step's hand-over (a span edit: the
# variants below replace all of it)
_R_LOOP = ("        row = start + tl.sum(tl.where(dist == length - 1, path, 0), axis=0)  # the root's row\n",
           "            kt, vt, gt, bt = kn, vn, gn, bn\n")
_R_PAIRS_BODY = """        g_all = dist.to(tl.float32) * 0.0
        b_all = g_all
        if GATES_FIRST:
            g_all, b_all = row_gates(g_base, b_base, start + path, dist < length, hv, s_gn, 1, s_bn, 1, neg_a,
                                     bias, GATED, True)
        k0, v0, g0, b0 = _replay_rows(k_base, v_base, g_base, b_base, path, dist, start, dist == length - 1,
                                      offs_k, offs_v, s_kn, s_vn, hv, s_gn, s_bn, neg_a, bias, g_all, b_all,
                                      K, V, GATED, GATES_FIRST)
        k1, v1, g1, b1 = _replay_rows(k_base, v_base, g_base, b_base, path, dist, start, dist == length - 2,
                                      offs_k, offs_v, s_kn, s_vn, hv, s_gn, s_bn, neg_a, bias, g_all, b_all,
                                      K, V, GATED, GATES_FIRST)
        for t in range(0, length, 2):
            k2, v2, g2, b2 = _replay_rows(k_base, v_base, g_base, b_base, path, dist, start,
                                          dist == length - 3 - t, offs_k, offs_v, s_kn, s_vn, hv, s_gn, s_bn,
                                          neg_a, bias, g_all, b_all, K, V, GATED, GATES_FIRST)
            k3, v3, g3, b3 = _replay_rows(k_base, v_base, g_base, b_base, path, dist, start,
                                          dist == length - 4 - t, offs_k, offs_v, s_kn, s_vn, hv, s_gn, s_bn,
                                          neg_a, bias, g_all, b_all, K, V, GATED, GATES_FIRST)
            n0 = tl.sum(k0 * k0, axis=0) * 0.0 + 1.0
            n1 = n0
            if USE_L2NORM:
                n0 = 1.0 / tl.sqrt(tl.sum(k0 * k0, axis=0) + 1e-6)
                n1 = 1.0 / tl.sqrt(tl.sum(k1 * k1, axis=0) + 1e-6)
            w0 = tl.sum(s * k0[None, :], axis=1)
            w1 = tl.sum(s * k1[None, :], axis=1)
            c01 = tl.sum(k0 * k1, axis=0)
            e0 = tl.exp(g0)
            e1 = tl.exp(g1)
            u0 = b0 * (v0 - (e0 * n0) * w0)
            u1 = b1 * (v1 - e1 * ((e0 * n1) * w1 + (n0 * n1 * c01) * u0))
            s = s * (e0 * e1) + (e1 * n0 * u0)[:, None] * k0[None, :] + (n1 * u1)[:, None] * k1[None, :]
            k0, v0, g0, b0, k1, v1, g1, b1 = k2, v2, g2, b2, k3, v3, g3, b3
"""
_R_PAIRS = (('@triton.jit(do_not_specialize=["n_slots", "n_rows"])\ndef _tree_commit_replay_kernel(\n', _R_ROWS_FN),
            (*_R_LOOP, _R_PAIRS_BODY))
# Four path nodes a step (the chain's 4 x 4 system by forward substitution, one update with
# four rank-1 terms): a quarter of the dependent steps, no prefetch (the four rows' loads
# are issued together at the top of each step).
_R_QUAD_ROW = """            k{i}, v{i}, g{i}, b{i} = _replay_rows(k_base, v_base, g_base, b_base, path, dist, start,
                                          dist == length - {j} - t, offs_k, offs_v, s_kn, s_vn, hv, s_gn, s_bn,
                                          neg_a, bias, g_all, b_all, K, V, GATED, GATES_FIRST)
"""
_R_QUADS_BODY = """        g_all = dist.to(tl.float32) * 0.0
        b_all = g_all
        if GATES_FIRST:
            g_all, b_all = row_gates(g_base, b_base, start + path, dist < length, hv, s_gn, 1, s_bn, 1, neg_a,
                                     bias, GATED, True)
        for t in range(0, length, 4):
""" + "".join(_R_QUAD_ROW.format(i=i, j=i + 1) for i in range(4)) + """            n0 = tl.sum(k0 * k0, axis=0) * 0.0 + 1.0
            n1 = n0
            n2 = n0
            n3 = n0
            if USE_L2NORM:
                n0 = 1.0 / tl.sqrt(tl.sum(k0 * k0, axis=0) + 1e-6)
                n1 = 1.0 / tl.sqrt(tl.sum(k1 * k1, axis=0) + 1e-6)
                n2 = 1.0 / tl.sqrt(tl.sum(k2 * k2, axis=0) + 1e-6)
                n3 = 1.0 / tl.sqrt(tl.sum(k3 * k3, axis=0) + 1e-6)
            w0 = tl.sum(s * k0[None, :], axis=1)
            w1 = tl.sum(s * k1[None, :], axis=1)
            w2 = tl.sum(s * k2[None, :], axis=1)
            w3 = tl.sum(s * k3[None, :], axis=1)
            c01 = tl.sum(k0 * k1, axis=0) * n0 * n1
            c02 = tl.sum(k0 * k2, axis=0) * n0 * n2
            c03 = tl.sum(k0 * k3, axis=0) * n0 * n3
            c12 = tl.sum(k1 * k2, axis=0) * n1 * n2
            c13 = tl.sum(k1 * k3, axis=0) * n1 * n3
            c23 = tl.sum(k2 * k3, axis=0) * n2 * n3
            e0 = tl.exp(g0)
            e1 = tl.exp(g1)
            e2 = tl.exp(g2)
            e3 = tl.exp(g3)
            d1 = e0 * e1
            d2 = d1 * e2
            d3 = d2 * e3
            u0 = b0 * (v0 - (e0 * n0) * w0)
            u1 = b1 * (v1 - (d1 * n1) * w1 - (e1 * c01) * u0)
            u2 = b2 * (v2 - (d2 * n2) * w2 - (e1 * e2 * c02) * u0 - (e2 * c12) * u1)
            u3 = b3 * (v3 - (d3 * n3) * w3 - (e1 * e2 * e3 * c03) * u0 - (e2 * e3 * c13) * u1 - (e3 * c23) * u2)
            s = (s * d3 + (e1 * e2 * e3 * n0 * u0)[:, None] * k0[None, :] + (e2 * e3 * n1 * u1)[:, None] * k1[None, :]
                 + (e3 * n2 * u2)[:, None] * k2[None, :] + (n3 * u3)[:, None] * k3[None, :])
"""
_R_QUADS = ((_R_PAIRS[0][0], _R_ROWS_FN), (*_R_LOOP, _R_QUADS_BODY))
# Paths of more than P nodes (not limits.REPLAY_STEP_PATH's 64) to the passes kernel (its
# tensor-core passes of 16 nodes): where the node-by-node walk's instructions, not the
# state's bytes, set a long accepted path's time (S7-a: chains of 8-16 cost 1.3-2.5x Eq. 10).
def _route(p: int) -> tuple:
    return (("    both = longest > REPLAY_STEP_PATH", f"    both = longest > {p}"),
            ("WALK=REPLAY_STEP_PATH if both", f"WALK={p} if both"),
            ("shortest=REPLAY_STEP_PATH)", f"shortest={p})"))


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

# --- attention over the KV cache (kernels.cache_attention; component_bench.py --attention-variants) --

# The merge before S9-b: one program a (request, KV head) and 16 rows, the chunks one at a time
# (two dependent loads a chunk: a 16k cache's 64 chunks at batch 1 cost ~30 us a layer).
_A_MERGE_SERIAL = (
    ("@triton.jit\ndef _cache_attention_merge(", "    tl.store(lse + b.to(tl.int64) * s_lb + h * s_lh + r, ls)\n",
     '@triton.jit\n'
     'def _cache_attention_merge(o_part, m_part, l_part, out, lse, slots, n_slots, rows, n_splits,\n'
     '                           s_ob, s_oh, s_ot, s_og, s_lb, s_lh, group,\n'
     '                           H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):\n'
     '    bh = tl.program_id(0)\n'
     '    b = bh // H\n'
     '    h = bh % H\n'
     '    slot = tl.load(slots + b).to(tl.int64)\n'
     '    poison = tl.where((slot >= 0) & (slot < n_slots), 0.0, float("nan"))\n'
     '    offs_r = tl.program_id(1) * BR + tl.arange(0, BR)\n'
     '    rmask = offs_r < rows\n'
     '    offs_d = tl.arange(0, BD)\n'
     '    mx = tl.full((BR,), float("-inf"), tl.float32)\n'
     '    for s in range(0, n_splits):\n'
     '        part = (bh.to(tl.int64) * n_splits + s) * rows + offs_r\n'
     '        mx = tl.maximum(mx, tl.load(m_part + part, mask=rmask, other=float("-inf")))\n'
     '    safe_mx = tl.where(mx == float("-inf"), 0.0, mx)\n'
     '    total = tl.zeros((BR,), tl.float32)\n'
     '    acc = tl.zeros((BR, BD), tl.float32)\n'
     '    for s in range(0, n_splits):\n'
     '        part = (bh.to(tl.int64) * n_splits + s) * rows + offs_r\n'
     '        w = tl.exp(tl.load(m_part + part, mask=rmask, other=float("-inf")) - safe_mx)\n'
     '        total += w * tl.load(l_part + part, mask=rmask, other=0.0)\n'
     '        acc += w[:, None] * tl.load(o_part + part[:, None] * BD + offs_d[None, :], mask=rmask[:, None], '
     'other=0.0)\n'
     '    has = total > 0\n'
     '    o = tl.where(has[:, None], acc / tl.where(has, total, 1.0)[:, None], 0.0) + poison\n'
     '    node, g = offs_r // group, offs_r % group\n'
     '    op = out + b.to(tl.int64) * s_ob + h * s_oh + (node * s_ot + g * s_og)[:, None] + offs_d[None, :]\n'
     '    tl.store(op, o.to(out.dtype.element_ty), mask=rmask[:, None] & (offs_d < D)[None, :])\n'
     '    ls = tl.where(has, safe_mx + tl.log(tl.where(has, total, 1.0)), float("-inf")) + poison\n'
     '    tl.store(lse + b.to(tl.int64) * s_lb + h * s_lh + offs_r, ls, mask=rmask)\n'),
    ("        _cache_attention_merge[(rows, bsz * hkv)](\n",
     "        _cache_attention_merge[(bsz * hkv, row_blocks)](\n"),
    ("            NSP=triton.next_power_of_2(splits), SB=MERGE_CHUNKS, num_warps=4)",
     "            BR=br, num_warps=4)"),
)

# --- GDN decode (kernels.gdn_decode; timed by experiments/component_bench.py --decode-variants) --

_D_LOAD = ("    ptr = state + safe * s_sn + hv * s_sh + offs_v[:, None] * S_SV + offs_k[None, :]\n"
           "    s = tl.load(ptr, mask=vmask[:, None] & kmask[None, :], other=0.0).to(tl.float32) * tl.exp(g)\n")
# The state tile's load issued first, before the q/k rows, the conv and the gates (SGLang's
# order): one memory round trip a program instead of two, the tile live across the conv.
_D_STATE_FIRST = (
    (_D_LOAD, "    s = s0.to(tl.float32) * tl.exp(g)\n"),
    ("    row = qk + req.to(tl.int64) * 2 * H * K\n",
     "    ptr = state + safe * s_sn + hv * s_sh + offs_v[:, None] * S_SV + offs_k[None, :]\n"
     "    s0 = tl.load(ptr, mask=vmask[:, None] & kmask[None, :], other=0.0)\n"
     "    row = qk + req.to(tl.int64) * 2 * H * K\n"),
)
# The state streamed past L2's keep set: read and written once a step, never reused in it.
_D_EVICT = (
    (_D_LOAD, _D_LOAD.replace("other=0.0)", "other=0.0, eviction_policy=\"evict_first\")")),
    ("    tl.store(ptr, s.to(state.dtype.element_ty), mask=v_write[:, None] & kmask[None, :])\n",
     "    tl.store(ptr, s.to(state.dtype.element_ty), mask=v_write[:, None] & kmask[None, :],"
     " eviction_policy=\"evict_first\")\n"),
)
# Ablations (wrong results; their time is the part's cost): v read as it comes, no conv and
# no window slide; o stored without the gated norm (SGLang's packed decode leaves it to a
# third launch).
_D_NO_CONV = (
    ("    v, v_win = _conv_channels(x + req.to(tl.int64) * s_xn, win, conv_w, v_ch, vmask, s_cd, s_cw, s_wd, "
     "conv_b,\n"
     "                              W, WP, HAS_BIAS)\n",
     "    v = tl.load(x + req.to(tl.int64) * s_xn + v_ch, mask=vmask, other=0.0).to(tl.float32)\n"),
    ("    tl.store(win + v_ch[:, None] * s_cd + cols[None, :] * s_cw, v_win, mask=v_write[:, None] & (cols < W - 1)"
     "[None, :])\n", ""),
)
# The state tile and the window stored last, after the head's norm and its arrival count: a
# release (the counter's acq_rel) waits for the program's earlier writes, so with the state
# stored first every program held its SM until its 8-16 KB of state had drained.
_D_WRITES = ("    tl.store(ptr, s.to(state.dtype.element_ty), mask=v_write[:, None] & kmask[None, :])\n"
             "    tl.debug_barrier()  # every read of this head's window is done before it slides\n"
             "    cols = tl.arange(0, WP)\n"
             "    tl.store(win + v_ch[:, None] * s_cd + cols[None, :] * s_cw, v_win, mask=v_write[:, None] & "
             "(cols < W - 1)[None, :])\n")
_D_STATE_LAST = (
    (_D_WRITES, ""),
    ("        tl.store(o_row + offs_v, out + poison, mask=vmask)\n",
     "        tl.store(o_row + offs_v, out + poison, mask=vmask)\n" + _D_WRITES),
)
_D_NO_NORM = (("    if NORM and VS > 1:", "    if False:"), ("        if NORM:\n", "        if False:\n"))
# The replay commit's state row stride: a compile-time constant up to
# limits.REPLAY_CONST_ROW_PATH path nodes, an argument past it (the launcher's rule,
# const_row_stride); these take one form at every length (the decode takes it as a constant
# always; NOTES "The state's row stride a constant").
_SV_RULE = "SV=const_row_stride(longest, st.stride(2)),"

# the request's span as loaded before the twentieth session: no clamp to the N nodes
_UNCLAMPED = (("    start, n_nodes, slot, in_pool = request_span(cu, state_idx, b, n_slots, n_rows)\n",
               "    start = tl.load(cu + b).to(tl.int64)\n"
               "    n_nodes = (tl.load(cu + b + 1) - start).to(tl.int32)\n"
               "    slot = tl.load(state_idx + b).to(tl.int64)\n"
               "    in_pool = (slot >= 0) & (slot < n_slots)\n"),)

# the commits' target as loaded before the twenty-first session: the offsets not clamped to
# the N nodes, the first row not moved to 0 for a request outside the pool or its tree
_C_UNCLAMPED_HEAD = ("        start = tl.load(cu + b).to(tl.int64)\n"
                     "        slot = tl.load(state_idx + b).to(tl.int64)\n"
                     "        in_pool = (slot >= 0) & (slot < n_slots) & (a < tl.load(cu + b + 1) - start)\n"
                     "        slot = tl.where(in_pool, slot, 0)\n"
                     "        a = tl.where(in_pool, a, 0)\n")
_C_UNCLAMPED = (("        start, _, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)\n",
                 _C_UNCLAMPED_HEAD),)
# accepted[b] truncated to int32 before it is compared (an int64 entry past 2^31 wraps)
_WRAPPING = (("    layer, b, hv, iv, a = commit_program(accepted, n_req, n_rows)\n",
              "    pid = tl.program_id(0)\n"
              "    b = pid % n_req\n"
              "    layer, hv, iv = (pid // n_req).to(tl.int64), tl.program_id(1), tl.program_id(2)\n"
              "    a = tl.load(accepted + b).to(tl.int32)\n"),)
_R_UNCLAMPED = (("        start, n_nodes, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)\n",
                 _C_UNCLAMPED_HEAD + "        n_nodes = tl.load(cu + b + 1) - start\n"),)

VARIANTS: dict[str, Variant] = {
    "a-merge-serial": Variant(ATTENTION, "the merge a chunk at a time, 16 rows a program (shipped before S9-b)",
                              _A_MERGE_SERIAL),
    "a-before-s9": Variant(ATTENTION, "the attention as shipped before S9-b: a-merge-serial, and one launch "
                           "for every shape (64 keys and 16 rows a tile, 4 warps, 3 stages)", _A_MERGE_SERIAL + (
                               ("launch or attention_launch(bsz, hkv, rows, max_keys, tree)",
                                "launch or (64, 4, 3, TARGET_PROGRAMS, MIN_SPLIT_KEYS, 16)"),)),
    "d-state-first": Variant(DECODE, "the state tile loaded first, before the conv and the gates (SGLang's order)",
                             _D_STATE_FIRST),
    "d-state-last": Variant(DECODE, "the state and the window stored after the norm's arrival count (its "
                            "release no longer waits for them)", _D_STATE_LAST),
    "d-evict": Variant(DECODE, "the state loaded and stored evict-first (streamed once a step)", _D_EVICT),
    "d-state-first-evict": Variant(DECODE, "d-state-first and d-evict together", _D_STATE_FIRST + (
        ("    s0 = tl.load(ptr, mask=vmask[:, None] & kmask[None, :], other=0.0)\n",
         "    s0 = tl.load(ptr, mask=vmask[:, None] & kmask[None, :], other=0.0, "
         "eviction_policy=\"evict_first\")\n"),
        _D_EVICT[1])),
    "d-no-conv": Variant(DECODE, "ablation: v as it comes (no conv), the window left in place", _D_NO_CONV),
    "d-no-norm": Variant(DECODE, "ablation: o without the gated norm (no split counters)", _D_NO_NORM),
    "r-fold-norm": Variant(REPLAY, "c11 with the k norm and the decay folded into the step's vectors (one "
                           "dependent reduction a node, no decay pass; S7-a: 0.96-1.13x)", _R_FOLD_NORM),
    "r-pairs": Variant(REPLAY, "c11 two path nodes a step (the pair's 2 x 2 system, one update; S7-a: 0.86x "
                       "at 1 x 64 chains, 1.0-1.16x elsewhere)", _R_PAIRS),
    "r-passes-4": Variant(REPLAY_ROUTE, "paths of more than 4 nodes to the passes kernel (not 64; S7-e, "
                           "an H100: slower from batch 4)", _route(4)),
    "r-passes-8": Variant(REPLAY_ROUTE, "paths of more than 8 nodes to the passes kernel (not 64; S7-e, "
                           "an H100: slower from batch 4)", _route(8)),
    "r-passes-16": Variant(REPLAY_ROUTE, "paths of more than 16 nodes to the passes kernel (not 64; S7-e, "
                           "an H100: slower from batch 4)",
                           _route(16)),
    "r-quads": Variant(REPLAY, "c11 four path nodes a step (the 4 x 4 system, one update; no prefetch; "
                       "S7-a: 1.10-1.84x)",
                       _R_QUADS),
    "r-row-arg": Variant(REPLAY_ROUTE, "the state's row stride a launch argument at every path length (as "
                         "before the eleventh session)", ((_SV_RULE, "SV=0,"),)),
    "r-row-const": Variant(REPLAY_ROUTE, "the state's row stride a compile-time constant at every path length "
                           "(S11-a, an H100: slower at 64-node chains)", ((_SV_RULE, "SV=st.stride(2),"),)),
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
    "v-unclamped": Variant(VERIFY_TILE, "the request's offsets as loaded, not clamped to the N nodes (shipped "
                           "before the twentieth session)", _UNCLAMPED),
    "b-unclamped": Variant(VERIFY_BLOCKED, "the request's offsets as loaded, not clamped to the N nodes (shipped "
                           "before the twentieth session)", _UNCLAMPED),
    "c-unclamped": Variant(COMMIT, "the request's offsets as loaded, not clamped to the N nodes, nor its first "
                           "row outside the pool or tree (shipped before the twenty-first session)", _C_UNCLAMPED),
    "r-unclamped": Variant(REPLAY, "the request's offsets as loaded, not clamped to the N nodes, nor its first "
                           "row outside the pool or tree (shipped before the twenty-first session)", _R_UNCLAMPED),
    "c-wrapping": Variant(COMMIT, "accepted truncated to int32 before it is compared (shipped before the "
                          "twenty-second session)", _WRAPPING),
    "r-wrapping": Variant(REPLAY, "accepted truncated to int32 before it is compared (shipped before the "
                          "twenty-second session)", _WRAPPING),
    "no-values": Variant(VERIFY_TILE, "ablation: no value loop (state products, solves' products, stores)",
                         _NO_VALUES),
}


def edited_source(site: KernelSite, edits) -> str:
    """The site module's source with every edit applied ((old, new), or (first, last, new) for
    a span); each text must match."""
    src = inspect.getsource(importlib.import_module(site.source))
    for *old, new in edits:
        for text in old:
            if text not in src:
                raise ValueError(f"{site.source}: edit no longer applies, text not found:\n{text}")
        if len(old) == 1:
            src = src.replace(old[0], new)
        else:  # a span: from its first text through its last
            first = src.index(old[0])
            last = src.index(old[1], first) + len(old[1])
            src = src[:first] + new + src[last:]
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
