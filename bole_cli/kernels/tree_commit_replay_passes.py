"""The replay commit's long paths (docs/design.md §2, "Replay commit"): an accepted path of
more than limits.REPLAY_STEP_PATH nodes (long chains; drafters' trees are far shallower)
is replayed DP nodes a pass, each pass solving the chain's own system against the state S
before it:

    W = K^ S^T,  R = D_beta (V - D_P W),  U = (I + G)^-1 R,  S <- P_last S + sum_j (P_last/P_j) u_j k^_j^T

exactly, in float32: raw 16-bit keys are exact in tf32, so K S^T and the update U^T K take
a tf32 high part of the float32 side plus the rest (two tf32 passes, exact but for the
rest's rounding, ~2^-21; tf32x3 without 16-bit keys), the Gram K K^T one tf32 pass, and the
inverse merges blocks in float32 (jit_math.inverse_by_blocks). The state is read from the
pool as each pass's operand and written after it. On the H200 this form commits 128-256
node chains 1.2-3.6x faster than the node-by-node kernel, whose steps each wait on a row's
load, and loses to it everywhere below (experiments/NOTES.md "Replay commit, node by node").

tree_commit_replay launches it after the node-by-node kernel when no promise keeps every
path within REPLAY_STEP_PATH nodes; each program walks its request's path and leaves paths
of SHORTEST nodes or fewer to that kernel, so exactly one of the two writes each slot.
"""

from __future__ import annotations

import triton
import triton.language as tl

from bole_cli.kernels.configs import REPLAY_PASSES_LAUNCH
from bole_cli.kernels.jit_math import commit_program, commit_target, gate_params, inverse_by_blocks, row_gates


@triton.jit
def split_dot(a, b, SPLIT_A: tl.constexpr, EXACT_KEYS: tl.constexpr):
    """a @ b to float32 accuracy, where one operand is raw keys (16-bit: exact in tf32, when
    EXACT_KEYS) and the other (a when SPLIT_A, else b) float32: that operand as a tf32 high
    part (its low 13 mantissa bits cleared) plus the rest, two tf32 passes. Without exact
    keys, Triton's tf32x3."""
    if EXACT_KEYS:
        if SPLIT_A:
            hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            out = tl.dot(hi, b, input_precision="tf32")
            out = tl.dot(a - hi, b, acc=out, input_precision="tf32")
        else:
            hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            out = tl.dot(a, hi, input_precision="tf32")
            out = tl.dot(a, b - hi, acc=out, input_precision="tf32")
    else:
        out = tl.dot(a, b, input_precision="tf32x3")
    return out


@triton.jit(do_not_specialize=["n_slots", "n_rows"])
def _replay_passes_kernel(
    state, state_idx, k, v, g, beta, A_log, dt_bias, parents, cu, accepted,
    n_req, n_slots, n_rows,
    s_sl, s_sn, s_sh, s_sv, s_kl, s_kn, s_kh, s_vl, s_vn, s_vh, s_gl, s_gn, s_bl, s_bn, s_al,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    DP: tl.constexpr, PMAX: tl.constexpr, USE_L2NORM: tl.constexpr, GATED: tl.constexpr,
    EXACT_KEYS: tl.constexpr, SHORTEST: tl.constexpr,
):
    layer, b, hv, iv, a = commit_program(accepted, n_req, n_rows)
    if a >= 0:
        h = hv // GROUP
        neg_a, bias = gate_params(A_log + layer * s_al, dt_bias + layer * s_al, hv, GATED)
        start, _, slot, a, in_pool = commit_target(cu, state_idx, b, a, n_slots, n_rows)
        # The accepted path, deepest first: path[i] is the accepted node's i-th ancestor.
        dist = tl.arange(0, PMAX)
        path = tl.zeros([PMAX], dtype=tl.int32)
        cur = a
        length = 0
        while (cur >= 0) & (length < PMAX):
            path = tl.where(dist == length, cur, path)
            nxt = tl.load(parents + start + cur).to(tl.int32)
            cur = tl.where(nxt < cur, nxt, -1)
            length += 1
        # a longer path, or an accepted node past the walk's PMAX parents (a broken max_nodes
        # promise, as the node-by-node kernel treats it), is no tree of the contract: no write
        in_pool = in_pool & (cur < 0) & (a < PMAX)
        if length > SHORTEST:  # shorter paths are the node-by-node kernel's
            offs_k = tl.arange(0, KP)
            kmask = offs_k < K
            offs_v = iv * BV + tl.arange(0, BV)
            vmask = offs_v < V
            s_ptr = state + layer * s_sl + slot * s_sn + hv * s_sh + offs_v[:, None] * s_sv + offs_k[None, :]
            tile_mask = vmask[:, None] & kmask[None, :]
            # no value column is stored for a request outside the pool or its tree
            store_mask = (offs_v < tl.where(in_pool, V, 0))[:, None] & kmask[None, :]
            k_base = k + layer * s_kl + h * s_kh
            v_base = v + layer * s_vl + hv * s_vh
            g_base = g + layer * s_gl
            b_base = beta + layer * s_bl
            steps = tl.arange(0, DP)
            lower = steps[:, None] > steps[None, :]
            for p0 in range(0, length, DP):
                # DP path nodes, root first, against the state before them (module docstring)
                pos = p0 + steps
                on = pos < length
                node = tl.sum(tl.where(dist[None, :] == (length - 1 - pos)[:, None], path[None, :], 0), axis=1)
                rows = start + node
                kr = tl.load(k_base + rows[:, None] * s_kn + offs_k[None, :],
                             mask=on[:, None] & kmask[None, :], other=0.0).to(tl.float32)
                vj = tl.load(v_base + rows[:, None] * s_vn + offs_v[None, :],
                             mask=on[:, None] & vmask[None, :], other=0.0).to(tl.float32)
                gj, bj = row_gates(g_base, b_base, rows, on, hv, s_gn, 1, s_bn, 1, neg_a, bias, GATED, True)
                if USE_L2NORM:
                    rn = 1.0 / tl.sqrt(tl.sum(kr * kr, axis=1) + 1e-6)
                else:
                    rn = tl.full([DP], 1.0, tl.float32)
                lc = tl.cumsum(gj, axis=0)  # log decay from the pass's start state, node included
                s = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)
                w = split_dot(kr, tl.trans(s), False, EXACT_KEYS) * rn[:, None]
                r = bj[:, None] * (vj - tl.exp(lc)[:, None] * w)
                gram = tl.dot(kr, tl.trans(kr), input_precision="tf32" if EXACT_KEYS else "tf32x3")
                gram = gram * rn[:, None] * rn[None, :]
                gmat = tl.where(lower & on[:, None],
                                bj[:, None] * tl.exp(tl.minimum(lc[:, None] - lc[None, :], 0.0)) * gram, 0.0)
                inv = inverse_by_blocks(gmat, steps, tl.minimum(DP, length - p0), "ieee")
                u = tl.dot(inv, r, input_precision="ieee")
                lc_end = tl.sum(tl.where(steps == tl.minimum(DP, length - p0) - 1, lc, 0.0), axis=0)
                wt = tl.where(on, tl.exp(lc_end - lc) * rn, 0.0)
                upd = split_dot(tl.trans(u * wt[:, None]), kr, True, EXACT_KEYS)
                # each pass writes its state (read back by the next, after a barrier)
                s_new = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32) * tl.exp(lc_end) + upd
                tl.store(s_ptr, s_new.to(state.dtype.element_ty), mask=store_mask)
                tl.debug_barrier()


def launch_passes(args: tuple, *, n_layers: int, bsz: int, hv: int, group: int, kdim: int, vdim: int, pmax: int,
                  use_l2norm: bool, gated: bool, exact_keys: bool, shortest: int) -> None:
    """The passes kernel over tree_commit_replay's argument tuple, for paths of more than
    `shortest` nodes (REPLAY_PASSES_LAUNCH: the form's measured launch, not tuned)."""
    cfg = REPLAY_PASSES_LAUNCH
    tile = cfg["BV"] if n_layers * bsz * hv > 32 else 16  # a single request: more, smaller tiles
    bv = max(16, min(tile, triton.next_power_of_2(vdim)))
    _replay_passes_kernel[(n_layers * bsz, hv, triton.cdiv(vdim, bv))](
        *args, GROUP=group, K=kdim, V=vdim, KP=max(16, triton.next_power_of_2(kdim)), BV=bv, DP=cfg["DP"],
        PMAX=pmax, USE_L2NORM=use_l2norm, GATED=gated, EXACT_KEYS=exact_keys, SHORTEST=shortest,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
