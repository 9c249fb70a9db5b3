"""SGLang's ReplaySSM chain verify for the embedded runtime (docs/design.md §6).

SGLang 0.5.23's snapshot-free chain verify (`--enable-linear-replayssm-spec`, top-k 1) in
the protocol a GDN model runs: the circular ring (docs/sglang-0.5.23.md, "ReplaySSM"). The
pool keeps a frozen checkpoint per slot; beside it, per request row, a ring of the last
committed steps' update vectors, normalised keys and log decays, with cursors (write_pos,
cache_base, is_flush) shared by every GDN layer. The verify reconstructs each draft
position's output from checkpoint + history and writes the window into the ring after the
history; the commit advances the cursors by the accepted length (accepted drafts + the
bonus token) and materialises the ring into the checkpoint only when it is due (every
commit for a bf16 pool; for float32 when the next window could overflow the ring).

So between materialisations the committed GDN state is checkpoint + ring, not
`cache.gdn_state` alone: the ring persists across steps with the pool it belongs to, and
`flush` folds it in for anyone who must read the state. The kernels and how SGLang calls
them live in `bole_cli.sglang.baseline_kernels` (`replayssm_ring_*`); this is the runtime's
path="replayssm" engine around them. Chains only: every request verifies a root-first
chain (node t's parent is t - 1), which is all the ring's causal mask can express.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from bole_cli.errors import BoleError
from bole_cli.limits import REPLAYSSM_MIN_KEY_DIM


class ReplaySSMGDN:
    """Rings, verify and commit for every GDN layer of a HybridModel. `kernels`: the
    `SGLangKernels` of bole_cli.sglang.baseline_kernels.load_sglang_kernels(). One ring per state
    pool (held while that pool lives; a pool is told by identity, not address); its rows are the pool's slots (SGLang keys the ring
    by request row and the checkpoint by mamba slot; in the runtime both are the slot)."""

    def __init__(self, kernels: Any):
        if getattr(kernels, "replayssm_ring_verify", None) is None:
            raise BoleError("the SGLang kernels object has no ReplaySSM ring verify")
        self.kernels = kernels
        self._rings: list[tuple[weakref.ref, dict]] = []  # (pool, its ring), live pools only

    def _ring_of(self, state: torch.Tensor) -> Optional[dict]:
        self._rings = [(ref, ring) for ref, ring in self._rings if ref() is not None]
        return next((ring for ref, ring in self._rings if ref() is state), None)

    def rings(self, state: torch.Tensor, tb, key_heads: int, dtype: torch.dtype) -> dict:
        """The ring of the pool `state` [L, S, HV, V, K] for windows of tb.max_nodes tokens,
        in the activation dtype `dtype` (SGLang: the conv dtype). The same ring at every
        step of the same pool; a new pool gets an empty one, and a window longer than the
        ring holds first folds the old ring into the pool (so no history is lost)."""
        from bole_cli.sglang.baseline_kernels import ring_len_for

        if state.dtype not in (torch.float32, torch.bfloat16):
            raise BoleError(f"ReplaySSM needs a float32 or bfloat16 GDN state pool, not {state.dtype}")
        if state.shape[-1] < REPLAYSSM_MIN_KEY_DIM:
            raise BoleError(f"ReplaySSM's ring kernel needs a GDN key dim of at least {REPLAYSSM_MIN_KEY_DIM}, "
                            f"not {state.shape[-1]}")
        length = ring_len_for(tb.max_nodes)
        ring = self._ring_of(state)
        if ring is not None and ring["replayssm_d"].shape[-2] >= length and ring["replayssm_d"].dtype == dtype:
            return ring
        if ring is not None:
            self.flush(state)
            self._rings = [(ref, r) for ref, r in self._rings if r is not ring]
        ring = self.kernels.replayssm_ring(state, state.shape[1], key_heads, dtype, length)
        self._rings.append((weakref.ref(state), ring))
        return ring

    def verify_layer(self, rings: dict, layer: int, q, k, v, a, b, A_log, dt_bias, state, tb) -> torch.Tensor:
        """One GDN layer: q, k [N, H, K]; v [N, HV, V]; a, b [N, HV]; state [S, HV, V, K]
        (the checkpoint, read only). Writes the window into the layer's ring (the cursors
        are only read); returns o [N, HV, V] in q's dtype."""
        return self.kernels.replayssm_ring_verify(
            A_log, dt_bias, q, k, v, a, b, checkpoint_state=state, ring=self.kernels.ring_layer(rings, layer),
            cache_indices=tb.slots, replay_indices=tb.slots, query_start_loc=tb.cu_seqlens,
            draft_token_num=tb.max_nodes)

    def commit(self, state: torch.Tensor, rings: dict, tb, accepted: torch.Tensor) -> None:
        """Commit each request's root-to-`accepted` prefix (accepted + 1 tokens; -1 commits
        nothing), all layers in one launch. accepted [B] on the device."""
        self.kernels.replayssm_ring_commit(state, rings, tb.slots, tb.slots, (accepted + 1).to(torch.int32),
                                           tb.max_nodes)

    def committed_state(self, state: torch.Tensor) -> torch.Tensor:
        """A copy of the pool holding the committed state (checkpoint + ring history folded
        in on copies); the live pool and ring are untouched. For readers of the state,
        such as a test's oracle."""
        out, ring = state.clone(), self._ring_of(state)
        if ring is not None:
            rows = torch.arange(state.shape[1], dtype=torch.int32, device=state.device)
            ring = {name: None if t is None else t.clone() for name, t in ring.items()}
            self.kernels.replayssm_ring_materialize(out, ring, rows, rows)
        return out

    def flush(self, state: torch.Tensor) -> None:
        """Fold every slot's ring history into `state` (SGLang's own materialisation), so the
        pool alone holds the committed state; a no-op for a pool without a ring."""
        ring = self._ring_of(state)
        if ring is not None:
            rows = torch.arange(state.shape[1], dtype=torch.int32, device=state.device)
            self.kernels.replayssm_ring_materialize(state, ring, rows, rows)
