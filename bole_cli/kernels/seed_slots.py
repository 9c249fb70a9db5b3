"""Seed the prefix-cache track slots of the SGLang plug-in's factor store: copy whole state
slots, every layer in one launch.

A track slot's committed state is the request's pre-verify state advanced to an accepted
ancestor, so before its commit reads it the slot gets a copy of the request's slot
(docs/design.md §6). Reference: `reference.seed_slots_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bole_cli.errors import BoleError
from bole_cli.kernels.validate import contiguous_vector

BLOCK_ELEMENTS = 4096


@triton.jit
def _seed_slots_kernel(state, src, dst, steps, n_req, n_slots, numel, s_l, s_s, BLOCK: tl.constexpr):
    """state[l, dst[b]] = state[l, src[b]] where steps[b] >= 0 and both slots are inside the
    pool of n_slots (whole slot entries)."""
    pid = tl.program_id(0)
    layer = (pid // n_req).to(tl.int64)
    b = pid % n_req
    st = tl.load(steps + b)
    d = tl.load(dst + b).to(tl.int64)
    s = tl.load(src + b).to(tl.int64)
    if (st >= 0) & (d >= 0) & (s >= 0) & (d < n_slots) & (s < n_slots):
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < numel
        v = tl.load(state + layer * s_l + s * s_s + offs, mask=m)
        tl.store(state + layer * s_l + d * s_s + offs, v, mask=m)


def seed_slots(state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, steps: torch.Tensor) -> None:
    """state [L, S, ...] with each slot entry contiguous: copy src slots to dst slots where
    steps >= 0 (the track slots, before their commit reads them as the pre-verify state); a
    request with a slot outside [0, S) copies nothing."""
    n_layers, slots = state.shape[:2]
    n_req = steps.shape[0]
    if n_req == 0 or n_layers == 0 or state.numel() == 0:
        return
    numel = state[0, 0].numel()
    if not state[0, 0].is_contiguous() or state.stride(1) < numel:
        raise BoleError("seed_slots: each state slot must be one contiguous block")
    block = BLOCK_ELEMENTS
    grid = (n_layers * n_req, triton.cdiv(numel, block))
    src, dst, steps = (contiguous_vector(t) for t in (src, dst, steps))  # read as raw memory
    _seed_slots_kernel[grid](state, src, dst, steps, n_req, slots, numel, state.stride(0), state.stride(1),
                             BLOCK=block, num_warps=4)
