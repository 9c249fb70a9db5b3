"""Float64-capable PyTorch references for one GDN layer over a packed forest of draft trees.

These are the ground truth the Triton kernels are tested against (docs/design.md §2-3). They
follow the kernels' tensor contract exactly and favour clarity over speed:

- `tree_verify_sequential_ref`: the baseline's semantics, node by node with a full state
  snapshot per node (what SGLang's serial verifier computes).
- `tree_verify_ref`: Theorem 1's closed form, O = D_P Q S + C (I+G)^-1 D_beta (V - D_P K S).
- `tree_commit_ref`: Eq. 10, the exact state after the accepted node.
- `tree_conv_ref` / `tree_conv_commit_ref`: the depthwise causal conv along ancestor chains.
- `gdn_gates_ref`: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
- `gdn_decode_ref`: one decode token per request, conv to gated norm (the fused decode kernel).
- `conv_window_commit_ref` / `seed_slots_ref`: the SGLang plug-in's conv-window commit over
  all layers and its track-slot seeding (copies: exact in any dtype).
- `pending_place_ref` / `pending_advance_ref`: the deferred write's segment bookkeeping.
- `draft_topk_ref`: a drafter level's top-k ids (a stable descending sort).

Layouts (SGLang's): q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV]; state [S, HV, V, K]
(the transposed state, K contiguous); parents [N] local to each request, -1 = child of the
committed prefix; cu_seqlens [B+1]. Ratios of decay products are always exp(logP_i -
logP_j), never P_i / P_j, so long chains with strong decay do not underflow to 0/0.
"""

from __future__ import annotations

from typing import Optional

import torch

from bole_cli.kernels.types import VerifyResult

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dim, as SGLang and fla normalise q and k."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _requests(cu_seqlens: torch.Tensor):
    cu = [int(c) for c in cu_seqlens.tolist()]
    return [(b, cu[b], cu[b + 1]) for b in range(len(cu) - 1)]


def _accepted_paths(parents, cu_seqlens, accepted):
    """(request, its first node's offset, the path from its accepted node up to the root) for
    each request that accepts a node (accepted >= 0)."""
    for b, start, _end in _requests(cu_seqlens):
        a = int(accepted[b])
        if a < 0:
            continue
        path = [a]
        while int(parents[start + path[-1]]) >= 0:
            path.append(int(parents[start + path[-1]]))
        yield b, start, path


def ancestor_mask(parents_local: list[int]) -> torch.Tensor:
    """M[i, j] = True when j is i or a proposal ancestor of i (A+(i))."""
    t = len(parents_local)
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i, p in enumerate(parents_local):
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def _prepare_qk(q, k, scale, use_qk_l2norm, dtype):
    q = q.to(dtype)
    k = k.to(dtype)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q * scale, k


def _gqa(x: torch.Tensor, hv: int) -> torch.Tensor:
    """Expand key heads [.., H, K] to value heads [.., HV, K]: value head h reads key head h // (HV // H)."""
    return x.repeat_interleave(hv // x.shape[-2], dim=-2)


def _log_p(parents_local: list[int], g: torch.Tensor) -> torch.Tensor:
    """logP_i = sum of g over A+(i), accumulated down each root path. g: [T, HV]."""
    out = torch.empty_like(g)
    for i, p in enumerate(parents_local):
        out[i] = g[i] + (out[p] if p >= 0 else 0.0)
    return out


def tree_verify_sequential_ref(
    q, k, v, g, beta, state, state_indices, parents, cu_seqlens,
    *, scale: Optional[float] = None, use_qk_l2norm: bool = True, dtype=torch.float64,
):
    """Node-by-node recurrence with one full state snapshot per node (the baseline).

    Returns (o [N, HV, V], snapshots [N, HV, V, K]) in `dtype`.
    """
    hv = v.shape[1]
    q, k = _prepare_qk(q, k, scale, use_qk_l2norm, dtype)
    q, k = _gqa(q, hv), _gqa(k, hv)
    v, g, beta = v.to(dtype), g.to(dtype), beta.to(dtype)
    n = q.shape[0]
    o = torch.empty(n, hv, v.shape[-1], dtype=dtype, device=q.device)
    snaps = torch.empty(n, hv, v.shape[-1], q.shape[-1], dtype=dtype, device=q.device)
    for b, start, end in _requests(cu_seqlens):
        s_pre = state[int(state_indices[b])].to(dtype)  # [HV, V, K]
        for t in range(start, end):
            p = int(parents[t])
            s_par = snaps[start + p] if p >= 0 else s_pre
            s_dec = torch.exp(g[t])[:, None, None] * s_par
            pred = torch.einsum("hvk,hk->hv", s_dec, k[t])
            u = beta[t][:, None] * (v[t] - pred)
            s_new = s_dec + torch.einsum("hv,hk->hvk", u, k[t])
            snaps[t] = s_new
            o[t] = torch.einsum("hvk,hk->hv", s_new, q[t])
    return o, snaps


def tree_verify_ref(
    q, k, v, g, beta, state, state_indices, parents, cu_seqlens,
    *, scale: Optional[float] = None, use_qk_l2norm: bool = True, dtype=torch.float64,
) -> VerifyResult:
    """Theorem 1's closed form; u solves (I + G) U = R by triangular substitution."""
    hv = v.shape[1]
    q, k = _prepare_qk(q, k, scale, use_qk_l2norm, dtype)
    q, k = _gqa(q, hv), _gqa(k, hv)
    v, g, beta = v.to(dtype), g.to(dtype), beta.to(dtype)
    o = torch.empty(v.shape, dtype=dtype)
    u_all = torch.empty(v.shape, dtype=dtype)
    log_p_all = torch.empty(g.shape, dtype=dtype)
    for b, start, end in _requests(cu_seqlens):
        if end == start:
            continue
        par = [int(p) for p in parents[start:end].tolist()]
        mask = ancestor_mask(par).to(dtype)  # [T, T], A+(i)
        strict = mask - torch.eye(len(par), dtype=dtype)
        log_p = _log_p(par, g[start:end])  # [T, HV]
        qs, ks, vs, bs = (x[start:end].transpose(0, 1) for x in (q, k, v, beta))  # head-major
        lp = log_p.transpose(0, 1)  # [HV, T]
        diff = lp[:, :, None] - lp[:, None, :]  # logP_i - logP_j
        ratio = torch.exp(torch.where(mask.bool(), diff, torch.full_like(diff, -torch.inf)))
        s_pre = state[int(state_indices[b])].to(dtype)  # [HV, V, K]
        kk = ks @ ks.transpose(1, 2)
        qk = qs @ ks.transpose(1, 2)
        gram = bs[:, :, None] * ratio * kk * strict
        c = ratio * qk * mask
        p = torch.exp(lp)[:, :, None]  # [HV, T, 1]
        ks_pre = ks @ s_pre.transpose(1, 2)  # [HV, T, V] rows k_i^T S
        qs_pre = qs @ s_pre.transpose(1, 2)
        r = bs[:, :, None] * (vs - p * ks_pre)
        eye = torch.eye(len(par), dtype=dtype).expand_as(gram)
        u = torch.linalg.solve_triangular(eye + gram, r, upper=False, unitriangular=True)
        o[start:end] = (p * qs_pre + c @ u).transpose(0, 1)
        u_all[start:end] = u.transpose(0, 1)
        log_p_all[start:end] = log_p
    return VerifyResult(o, u_all, log_p_all)


def _each_layer(commit_ref, state, state_indices, layered: tuple, parents, cu_seqlens, accepted,
                use_qk_l2norm: bool) -> torch.Tensor:
    """A commit reference over a leading layer dimension of state and the `layered` tensors."""
    return torch.stack([commit_ref(state[l], state_indices, *(t[l] for t in layered), parents, cu_seqlens, accepted,
                                   use_qk_l2norm=use_qk_l2norm) for l in range(state.shape[0])])


def _commit_keys(k, hv: int, use_qk_l2norm: bool) -> torch.Tensor:
    """The commits' keys in float64, unit when asked, one per value head [N, HV, K]."""
    k = k.to(torch.float64)
    return _gqa(l2norm(k) if use_qk_l2norm else k, hv)


def tree_commit_ref(
    state, state_indices, k, u, log_p, parents, cu_seqlens, accepted,
    *, use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Eq. 10: S_new = P_a S + sum_{j in A+(a)} ratio(a, j) k_j u_j^T for each request's
    accepted node a. Returns a new state pool in state's dtype (input untouched); a
    leading layer dimension on state/k/u/log_p is handled by recursion.
    """
    if state.dim() == 5:
        return _each_layer(tree_commit_ref, state, state_indices, (k, u, log_p), parents, cu_seqlens, accepted,
                           use_qk_l2norm)
    new = state.clone()
    k = _commit_keys(k, u.shape[1], use_qk_l2norm)
    for b, start, path in _accepted_paths(parents, cu_seqlens, accepted):
        a = path[0]
        lp = log_p[start + a].to(torch.float64)  # [HV]
        slot = int(state_indices[b])
        s = torch.exp(lp)[:, None, None] * state[slot].to(torch.float64)
        for j in path:
            w = torch.exp(lp - log_p[start + j].to(torch.float64))
            s = s + w[:, None, None] * torch.einsum("hv,hk->hvk", u[start + j].to(torch.float64), k[start + j])
        new[slot] = s.to(state.dtype)
    return new


def tree_commit_replay_ref(
    state, state_indices, k, v, g, beta, parents, cu_seqlens, accepted,
    *, use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """The recurrence along each request's accepted path, root first, in float64: S <-
    exp(g_j) S; u_j = beta_j (v_j - S k_j); S <- S + u_j k_j^T. Returns a new state pool in
    state's dtype (rounded once, input untouched); a leading layer dimension on state, k, v,
    g and beta is handled by recursion."""
    if state.dim() == 5:
        return _each_layer(tree_commit_replay_ref, state, state_indices, (k, v, g, beta), parents, cu_seqlens,
                           accepted, use_qk_l2norm)
    new = state.clone()
    k = _commit_keys(k, v.shape[1], use_qk_l2norm)
    for b, start, path in _accepted_paths(parents, cu_seqlens, accepted):
        slot = int(state_indices[b])
        s = state[slot].to(torch.float64)  # [HV, V, K]
        for j in reversed(path):
            s = torch.exp(g[start + j].to(torch.float64))[:, None, None] * s
            u = beta[start + j].to(torch.float64)[:, None] * (
                v[start + j].to(torch.float64) - torch.einsum("hvk,hk->hv", s, k[start + j]))
            s = s + torch.einsum("hv,hk->hvk", u, k[start + j])
        new[slot] = s.to(state.dtype)
    return new


def _chain(parents_local: list[int], i: int, width: int) -> list[int]:
    """Local indices i, parent(i), ... up to `width` nodes (shorter when a root is hit)."""
    out = [i]
    while len(out) < width and parents_local[out[-1]] >= 0:
        out.append(parents_local[out[-1]])
    return out


def tree_conv_ref(x, conv_state, weight, bias, state_indices, parents, cu_seqlens, *, activation: bool = True):
    """Depthwise causal conv (width W) along each node's ancestor chain.

    x [N, D]; conv_state [S, D, W-1] (the last W-1 committed inputs, oldest first);
    weight [D, W] (weight[:, W-1] multiplies the newest input); bias [D] or None.
    Above the root the chain continues into conv_state. Returns y [N, D] in float64.
    """
    width = weight.shape[1]
    x64, w64 = x.to(torch.float64), weight.to(torch.float64)
    y = torch.empty(x.shape, dtype=torch.float64)
    for b, start, end in _requests(cu_seqlens):
        par = [int(p) for p in parents[start:end].tolist()]
        hist = conv_state[int(state_indices[b])].to(torch.float64)  # [D, W-1]
        for i in range(end - start):
            chain = _chain(par, i, width)
            cols = [x64[start + j] for j in reversed(chain)]  # oldest .. newest
            need = width - len(cols)
            window = [hist[:, width - 1 - need + c] for c in range(need)] + cols
            acc = (torch.stack(window, dim=1) * w64).sum(1)
            if bias is not None:
                acc = acc + bias.to(torch.float64)
            y[start + i] = torch.nn.functional.silu(acc) if activation else acc
    return y


def tree_conv_commit_ref(conv_state, x, state_indices, parents, cu_seqlens, accepted):
    """New conv windows: the last W-1 inputs along the root path ending at the accepted node."""
    new = conv_state.clone()
    keep = conv_state.shape[-1]
    for b, start, end in _requests(cu_seqlens):
        a = int(accepted[b])
        if a < 0:
            continue
        par = [int(p) for p in parents[start:end].tolist()]
        chain = _chain(par, a, keep)
        slot = int(state_indices[b])
        cols = [x[start + j].to(conv_state.dtype) for j in reversed(chain)]
        need = keep - len(cols)
        old = conv_state[slot]
        window = [old[:, keep - need + c] for c in range(need)] + cols
        new[slot] = torch.stack(window, dim=1)
    return new


def conv_window_commit_ref(conv, x, prev, dst, parents, cu_seqlens, accepted):
    """`conv_window_commit`: every layer's new window in the slots dst[b], from the root path
    of accepted[b] (a walk that stops at a parent that is not an earlier node), then the
    newest columns of the request's pre-verify window prev[:, b]. conv [L, S, D, W-1],
    x [L, T, D], prev [L, B', D, W-1]; accepted[b] outside the request or dst[b] outside
    [0, S): slot left alone."""
    new = conv.clone()
    keep = conv.shape[-1]
    for b, start, end in _requests(cu_seqlens):
        node, slot = int(accepted[b]), int(dst[b])
        if not (0 <= node < end - start and 0 <= slot < conv.shape[1]):
            continue
        par = [int(p) for p in parents[start:end].tolist()]
        path = []
        while node >= 0 and len(path) < keep:
            path.append(node)
            node = par[node] if par[node] < node else -1
        cols = [x[:, start + j].to(torch.float64) for j in reversed(path)]  # [L, D] each
        need = keep - len(cols)
        window = [prev[:, b, :, keep - need + c].to(torch.float64) for c in range(need)] + cols
        if window:
            new[:, slot] = torch.stack(window, dim=-1).to(conv.dtype)
    return new


def seed_slots_ref(state, src, dst, steps):
    """`seed_slots`: state[:, dst[b]] = state[:, src[b]] (the values before any copy) where
    steps[b] >= 0 and dst[b], src[b] lie in [0, S)."""
    new = state.clone()
    for b in range(steps.shape[0]):
        if int(steps[b]) >= 0 and 0 <= int(dst[b]) < state.shape[1] and 0 <= int(src[b]) < state.shape[1]:
            new[:, int(dst[b])] = state[:, int(src[b])]
    return new


def draft_topk_ref(logits, k, token_map=None):
    """`draft_topk`: each row's k largest logits' ids, descending, equal values by the lower
    id, NaN as +inf; token_map[id] when given."""
    x = logits.double()
    x = torch.where(torch.isnan(x), torch.inf, x)
    ids = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]
    return ids if token_map is None else token_map.long()[ids]


def pending_place_ref(segment, draft, pending):
    """`pending_place`: (new segment tensors, rows). Draft row j of request b goes to its
    segment row b * width + p + j, p the pending count clamped to 0..width - C (copies: exact)."""
    bsz = pending.shape[0]
    width, nodes = segment[0].shape[0] // bsz, draft[0].shape[0] // bsz
    new = [t.clone() for t in segment]
    rows = torch.empty(bsz * nodes, dtype=torch.int64)
    for b in range(bsz):
        p = min(max(int(pending[b]), 0), width - nodes)
        for j in range(nodes):
            rows[b * nodes + j] = b * width + p + j
            for dst, src in zip(new, draft):
                dst[b * width + p + j] = src[b * nodes + j]
    return new, rows


def pending_advance_ref(pending, accepted, draft_nodes: int, width: int):
    """`pending_advance`: (fold, next pending) as lists. The accepted rows join the pending
    ones (an accepted node outside -1..C - 1 adds none); when the next draft would not fit,
    fold = the last held row and the count restarts at 0, else fold = -1."""
    fold, nxt = [], []
    for p, a in zip(pending.tolist(), accepted.tolist()):
        p = min(max(p, 0), width - draft_nodes)
        held = p + (a + 1 if -1 <= a < draft_nodes else 0)
        due = held + draft_nodes > width
        fold.append(held - 1 if due else -1)
        nxt.append(0 if due else held)
    return fold, nxt


def gdn_gates_ref(A_log, a, dt_bias, b, *, softplus_threshold: float = 20.0):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), in float64. a, b: [N, HV]."""
    x = a.to(torch.float64) + dt_bias.to(torch.float64)
    sp = torch.where(x > softplus_threshold, x, torch.log1p(torch.exp(torch.clamp(x, max=softplus_threshold))))
    g = -torch.exp(A_log.to(torch.float64)) * sp
    return g, torch.sigmoid(b.to(torch.float64))


def gdn_decode_ref(x, conv_state, conv_w, conv_b, a, b, A_log, dt_bias, state, state_indices, *,
                   key_heads: int, z=None, norm_w=None, eps: float = 1e-6, scale: Optional[float] = None,
                   use_qk_l2norm: bool = True):
    """One decode token per request in float64: SiLU(conv) over the window and x, the gates,
    the recurrence S <- exp(g) S + beta (v - S k) k^T, o = S q and, with z and norm_w, the
    gated RMSNorm rms(o) * norm_w * silu(z). Returns (out [B, HV V], new state, new conv
    state); slots not in state_indices are unchanged. Layouts as gdn_decode's."""
    f64 = torch.float64
    n_slots, hv, vdim, kdim = state.shape
    hk = key_heads
    new_state, new_conv = state.clone(), conv_state.clone()
    idx = [int(s) for s in state_indices]
    window = conv_state[idx].to(f64)  # [B, D, W-1]
    full = torch.cat([window, x.to(f64).unsqueeze(-1)], dim=-1)
    y = (full * conv_w.to(f64)).sum(-1) + (0.0 if conv_b is None else conv_b.to(f64))
    y = torch.nn.functional.silu(y)
    q = y[:, : hk * kdim].view(-1, hk, kdim)
    k = y[:, hk * kdim: 2 * hk * kdim].view(-1, hk, kdim)
    v = y[:, 2 * hk * kdim:].view(-1, hv, vdim)
    q, k = _prepare_qk(q, k, kdim ** -0.5 if scale is None else scale, use_qk_l2norm, f64)
    q, k = _gqa(q, hv), _gqa(k, hv)
    g, beta = gdn_gates_ref(A_log, a, dt_bias, b)
    s = state[idx].to(f64) * torch.exp(g)[..., None, None]  # [B, HV, V, K]
    u = beta[..., None] * (v - (s @ k[..., None])[..., 0])
    s = s + u[..., None] * k[..., None, :]
    o = (s @ q[..., None])[..., 0]  # [B, HV, V]
    if z is not None:
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps) * norm_w.to(f64)
        o = o * torch.nn.functional.silu(z.to(f64).view(o.shape))
    new_state[idx] = s.to(state.dtype)
    new_conv[idx] = full[..., 1:].to(conv_state.dtype)
    return o.reshape(o.shape[0], -1), new_state, new_conv
