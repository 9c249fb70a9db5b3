"""The plug-in's tensor plumbing: SGLang's verify / commit arguments -> Bole's kernels.

A `FactorStore` is the arena that replaces SGLang's per-node snapshot buffers for one
MambaPool (sizes: bole_cli/sglang/plan.py). Every GDN layer owns a slice of it:

    k      [L, T, H, K]        activation dtype  raw k of each draft token (verify input)
    v      [L, T, HV, V]       activation dtype  v of each draft token (verify input)
    g, beta [L, T, HV]         float32           the gates (written by gdn_gates, read by both)
    u, log_p [T, HV, V], [T, HV]  float32        one layer's verify factors (scratch: the
                                                 replay commit rebuilds the state from k, v, g, beta)
    x      [L, T, conv_dim]    conv dtype        the conv inputs (mixed_qkv before the conv)
    conv_prev [L, R, conv_dim, W-1]  conv dtype  each request's committed window before verify
    parents [T] int32 (shared: the tree is the same in every layer)

T = R x D packed token positions, exactly as SGLang packs the verify batch (request b's
nodes at query_start_loc[b] + i). The three entry points mirror SGLang 0.5.23's calls:

- `capture_conv` runs (from the GDNAttnBackend.forward_extend hook) BEFORE SGLang's tree
  conv, which overwrites the committed conv window during verify
  (causal_conv1d_triton's tree conv): it keeps the conv inputs and the old window.
- `verify` replaces TritonGDNKernel.target_verify: same arguments, same output
  ([1, T, HV, V] in q's dtype); it computes SGLang's gates into the layer's g, beta
  (gdn_gates: SGLang's softplus/sigmoid), keeps k and v, and runs Bole's closed form
  (tree_verify, SGLang's l2norm/scale) instead of a snapshot per node, promising the drafter's depth
  (BolePlan.depth_promise: shallow big trees go level by level). ssm_states is only read. Trees take
  their parents from retrieve_parent_token (filled by SGLang's tree conv); chains (top-k
  1, and the dummy runs of trees) carry none: SGLang's chain metadata has no retrive_*
  tensors (HybridLinearAttnBackend's metadata builders), so the parents are 0..D-2.
- `commit` replaces HybridLinearAttnBackend.update_mamba_state_after_mtp_verify's scatter:
  ONE tree_commit_replay launch over all layers (the accepted path replayed in float32:
  the state exact to float32, docs/design.md §9) plus one conv-window launch, for the
  accepted nodes (SGLang's last_correct_step_indices: the local index of the deepest
  accepted node, -1 = leave the slot alone), then the same for the prefix-cache track
  slots (mamba_steps_to_track), whose state is the pre-verify state advanced to an
  accepted ancestor: the slot is first seeded with the request's pre-verify state.

No host synchronisation anywhere (shapes only; check_trees=False), so all of it can be
captured in a CUDA graph. Layers are found from `ssm_states.data_ptr()` (temporal[l]),
because target_verify receives no layer id.
"""

from __future__ import annotations

import threading
import weakref
from typing import Optional

import torch

from bole_cli.errors import BoleError
from bole_cli.kernels import VerifyResult, gdn_gates, tree_commit_replay, tree_verify
from bole_cli.kernels.conv_window_commit import conv_window_commit
from bole_cli.kernels.seed_slots import seed_slots
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.memory import FLOAT_DTYPES, canonical_dtype
from bole_cli.sglang.plan import BolePlan

_TORCH_DTYPES = {name: getattr(torch, name) for name in FLOAT_DTYPES}


def torch_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return _TORCH_DTYPES[canonical_dtype(name)]


# --------------------------------------------------------------------------- the store

_REGISTRY: dict[int, tuple["FactorStore", int]] = {}
_LOCK = threading.Lock()


def lookup(ssm_states) -> Optional[tuple["FactorStore", int]]:
    """(store, layer) owning this temporal[layer] view, or None (not a Bole pool).

    Never under torch.compile: dynamo cannot trace data_ptr() of its fake tensors, and the
    plug-in refuses pools when --enable-torch-compile is on (plan.decide), so a traced
    verify reaching a Bole pool is an error, not a silent fallback."""
    if not _REGISTRY or not isinstance(ssm_states, torch.Tensor):
        return None
    if torch.compiler.is_compiling():
        raise BoleError("Bole plug-in: torch.compile traced a verify while a Bole pool exists; "
                        "serve without --enable-torch-compile or with BOLE_DISABLE=1")
    found = _REGISTRY.get(ssm_states.data_ptr())
    if found is not None and found[0]._temporal() is None:  # the pool is gone: a stale address
        found[0].unbind()
        return None
    return found


class FactorStore:
    """Bole's per-pool arena; see the module docstring for the layout."""

    def __init__(self, plan: BolePlan, device) -> None:
        self.plan = plan
        self.device = torch.device(device)
        p, dev = plan, self.device
        act, conv = torch_dtype(p.act_dtype), torch_dtype(p.conv_dtype)
        t, rows, L = p.tokens, p.rows, p.layers
        self.k = torch.zeros(L, t, p.key_heads, p.key_dim, dtype=act, device=dev)
        self.v = torch.zeros(L, t, p.value_heads, p.value_dim, dtype=act, device=dev)
        self.g = torch.zeros(L, t, p.value_heads, dtype=torch.float32, device=dev)
        self.beta = torch.zeros(L, t, p.value_heads, dtype=torch.float32, device=dev)
        self.u = torch.zeros(t, p.value_heads, p.value_dim, dtype=torch.float32, device=dev)
        self.log_p = torch.zeros(t, p.value_heads, dtype=torch.float32, device=dev)
        self.x = torch.zeros(L, t, p.conv_dim, dtype=conv, device=dev)
        self.conv_prev = torch.zeros(L, rows, p.conv_dim, p.conv_window, dtype=conv, device=dev)
        self.parents = torch.full((t,), -1, dtype=torch.int32, device=dev)
        self.slots = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.chain = (torch.arange(p.draft_tokens, dtype=torch.int32, device=dev) - 1)
        self.config = {"precision": p.precision} if p.precision else None
        # the commit's promises, from the plan alone (a verify replayed from a CUDA graph runs no
        # Python, so its own width is not seen here): no request holds more than D nodes, and a
        # max_depth that a dummy chain breaks costs the commit time, never exactness
        self.commit_promise = {"max_nodes": p.draft_tokens if 1 <= p.draft_tokens <= MAX_TREE_NODES else None,
                               "max_depth": plan.depth_promise(p.draft_tokens, tree=not p.chain)}
        self._bound: list[int] = []
        self._temporal = lambda: None

    # ---- bookkeeping
    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in
                   (self.k, self.v, self.g, self.beta, self.u, self.log_p, self.x, self.conv_prev,
                    self.parents, self.slots, self.chain))

    def bind(self, temporal: torch.Tensor) -> "FactorStore":
        """Register temporal[l] (the ssm_states SGLang hands target_verify) for every layer."""
        if temporal.dim() != 5 or temporal.shape[0] != self.plan.layers:
            raise BoleError(f"FactorStore.bind: temporal {tuple(temporal.shape)} does not hold "
                            f"{self.plan.layers} layers [L, S, HV, V, K]")
        self._temporal = weakref.ref(temporal)
        with _LOCK:
            for layer in range(self.plan.layers):
                ptr = temporal[layer].data_ptr()
                _REGISTRY[ptr] = (self, layer)
                self._bound.append(ptr)
        return self

    def unbind(self) -> None:
        with _LOCK:
            for ptr in self._bound:
                if _REGISTRY.get(ptr, (None,))[0] is self:
                    del _REGISTRY[ptr]
            self._bound.clear()

    def _check_tokens(self, n_tokens: int, bsz: int, what: str) -> None:
        if n_tokens > self.plan.tokens or bsz > self.plan.rows:
            raise BoleError(
                f"Bole {what}: a verify batch of {bsz} requests / {n_tokens} tokens exceeds the "
                f"factor arena ({self.plan.rows} rows x {self.plan.draft_tokens} tokens); raise "
                "--max-running-requests consistently or lower the CUDA-graph batch size")

    # ---- verify-time
    def capture_conv(self, layer: int, mixed_qkv: torch.Tensor, conv_states: torch.Tensor,
                     cache_indices: torch.Tensor, draft_token_num: int) -> None:
        """Keep the conv inputs [T, conv_dim] and the pre-verify windows of the batch.

        conv_states: this layer's pool [S, conv_dim, W-1]; cache_indices: the verify's
        mamba_cache_indices (-1 = CUDA-graph padding: a harmless read of the last slot)."""
        n_tokens = mixed_qkv.shape[0]
        bsz = n_tokens // max(int(draft_token_num), 1)
        self._check_tokens(n_tokens, bsz, "capture_conv")
        self.x[layer, :n_tokens].copy_(mixed_qkv)
        if bsz:
            self.conv_prev[layer, :bsz].copy_(conv_states[cache_indices[:bsz]])

    def verify(self, layer: int, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices,
               query_start_loc, retrieve_parent_token, draft_token_num: Optional[int] = None):
        """TritonGDNKernel.target_verify's job, in closed form. Returns [1, T, HV, V]."""
        n_tokens = q.shape[1]
        bsz = query_start_loc.shape[0] - 1
        self._check_tokens(n_tokens, bsz, "verify")
        # Node i of request b sits at query_start_loc[b] + i = b * D + i (trees: every request
        # has D nodes). Parents from the conv kernel's retrieve_parent_token [bs, D] (entry 0
        # is 0, "n/a": the root); a missing table (SGLang's dummy runs) means chains.
        if retrieve_parent_token is not None:
            width = retrieve_parent_token.shape[1]
            rows = min(bsz, retrieve_parent_token.shape[0], n_tokens // max(width, 1))
            pv = self.parents[: rows * width].view(rows, width)
            pv.copy_(retrieve_parent_token[:rows])
            pv[:, 0] = -1
        else:
            width = int(draft_token_num or (n_tokens // max(bsz, 1)) or 1)
            rows = n_tokens // width
            chain = (self.chain[:width] if width <= self.chain.shape[0] else
                     torch.arange(width, dtype=torch.int32, device=self.device) - 1)
            self.parents[: rows * width].view(rows, width).copy_(chain.expand(rows, width))
        slots = self.slots[:bsz]
        slots.copy_(cache_indices[:bsz])
        slots.clamp_(min=0)  # PAD_SLOT_ID rows (no nodes) must not read before the pool
        kk, vv = self.k[layer, :n_tokens], self.v[layer, :n_tokens]
        kk.copy_(k[0])
        vv.copy_(v[0])
        gates = (self.g[layer, :n_tokens], self.beta[layer, :n_tokens])
        gdn_gates(A_log, a, dt_bias, b, out=gates)
        o = torch.empty((n_tokens, v.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
        tree_verify(
            q[0], kk, vv, gates[0], gates[1], ssm_states, slots,
            self.parents[:n_tokens], query_start_loc,
            use_qk_l2norm=True, check_trees=False, config=self.config,
            max_nodes=width if 1 <= width <= MAX_TREE_NODES else None,  # every request has D nodes
            max_depth=self.plan.depth_promise(width, tree=retrieve_parent_token is not None),
            out=VerifyResult(o, self.u[:n_tokens], self.log_p[:n_tokens]),
            factors=False,  # the replay commit below reads neither u nor log_p
        )
        return o.unsqueeze(0)

    # ---- commit-time
    def commit(self, temporal: torch.Tensor, conv: torch.Tensor, dst_slots: torch.Tensor,
               accepted: torch.Tensor, query_start_loc: torch.Tensor,
               track_slots: Optional[torch.Tensor] = None,
               track_steps: Optional[torch.Tensor] = None) -> None:
        """Commit every layer's accepted node (and the track slots' nodes) in place.

        temporal [L, S, HV, V, K]; conv [L, S, conv_dim, W-1]; dst_slots / accepted [n];
        query_start_loc: the verify's, >= n+1 entries."""
        n = accepted.shape[0]
        if n == 0:
            return
        self._check_tokens(0, n, "commit")
        cu = query_start_loc[: n + 1]
        if track_slots is not None and track_steps is not None:
            track_slots, track_steps = track_slots[:n], track_steps[:n]
            seed_slots(temporal, dst_slots, track_slots, track_steps)
            self._commit(temporal, conv, track_slots, track_steps, cu)
        self._commit(temporal, conv, dst_slots, accepted, cu)

    def _commit(self, temporal, conv, slots, accepted, cu) -> None:
        tree_commit_replay(temporal, slots, self.k, self.v, self.g, self.beta, self.parents, cu, accepted,
                           use_qk_l2norm=True, check_trees=False, **self.commit_promise)
        conv_window_commit(conv, self.x, self.conv_prev, slots, self.parents, cu, accepted)
