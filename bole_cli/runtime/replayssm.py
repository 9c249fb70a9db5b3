"""SGLang's ReplaySSM chain verify for the embedded runtime (docs/design.md §6).

SGLang 0.5.23's snapshot-free chain verify (`--enable-linear-replayssm-spec`, top-k 1), in
its *fold* protocol: the recurrent kernel runs with the state frozen and stores each draft
token's raw v, k, g, beta in a per-slot ring; after sampling, the fold replays each
request's accepted prefix into the float32 state. (0.5.23 uses the fold for KDA models; a
GDN model gets a circular ring instead, not modelled here: docs/sglang-0.5.23.md, "Chain
mode for contrast".) The kernels and how SGLang calls them live in
`bole_cli.sglang.kernels` (`replayssm_verify`, `replayssm_fold`); this is the runtime's
path="replayssm" engine around them. Chains only: every request verifies a root-first
chain (node t's parent is t - 1), which is all the kernel's recurrence can express.
"""

from __future__ import annotations

from typing import Any

import torch

from bole_cli.errors import BoleError


class ReplaySSMGDN:
    """Rings, verify and fold for every GDN layer of a HybridModel. `kernels`: the
    `SGLangKernels` of bole_cli.sglang.kernels.load_sglang_kernels()."""

    def __init__(self, kernels: Any):
        if getattr(kernels, "replayssm_verify", None) is None:
            raise BoleError("the SGLang kernels object has no ReplaySSM verify")
        self.kernels = kernels

    def rings(self, state: torch.Tensor, tb, key_heads: int, dtype: torch.dtype) -> dict:
        """One verify's rings for the pool `state` [L, S, HV, V, K]: tb.max_nodes tokens per slot."""
        return self.kernels.replayssm_rings(state, tb.max_nodes, key_heads, dtype)

    def verify_layer(self, rings: dict, layer: int, q, k, v, a, b, A_log, dt_bias, state, tb) -> torch.Tensor:
        """One GDN layer: q, k [N, H, K]; v [N, HV, V]; a, b [N, HV]; state [S, HV, V, K]
        (read only). Writes the layer's rings; returns o [N, HV, V] in v's dtype."""
        o = self.kernels.replayssm_verify(
            A_log, dt_bias, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), a, b,
            ssm_states=state, cache_indices=tb.slots, query_start_loc=tb.cu_seqlens,
            rings={name: r[layer] for name, r in rings.items()})
        return o.reshape(v.shape)

    def commit(self, state: torch.Tensor, rings: dict, tb, accepted: torch.Tensor) -> None:
        """Fold each request's root-to-`accepted` prefix (accepted + 1 tokens; -1 folds
        nothing) into the pool, all layers in one launch. accepted [B] on the device."""
        self.kernels.replayssm_fold(state, rings, tb.slots, (accepted + 1).to(torch.int32))
