"""State pools whose rows are not K apart, for the kernels that take the state's row stride as
a compile-time constant (kernels/gdn_decode.py always, kernels/tree_commit_replay.py for short
paths): a kernel that assumed rows K apart reads and writes the wrong rows here."""

from __future__ import annotations

import torch

PAD = 8  # columns after each row of a "padded" pool, NaN, never to be written
LAYOUTS = ("dense", "padded", "heads-inner")


def state_of(dense: torch.Tensor, layout: str) -> torch.Tensor:
    """dense [..., HV, V, K] in a pool of another row stride: "padded" rows of K + PAD with NaN
    in the pad; "heads-inner" [..., V, HV, K] seen as [..., HV, V, K] (rows HV K apart)."""
    if layout == "padded":
        pool = torch.full((*dense.shape[:-1], dense.shape[-1] + PAD), float("nan"), dtype=dense.dtype,
                          device=dense.device)
        pool[..., :dense.shape[-1]] = dense
        return pool[..., :dense.shape[-1]]
    if layout == "heads-inner":
        return dense.transpose(-3, -2).contiguous().transpose(-3, -2)
    return dense


def pad_of(state: torch.Tensor) -> torch.Tensor:
    """The PAD columns after each row of a "padded" state."""
    return state.as_strided((*state.shape[:-1], PAD), state.stride(), state.storage_offset() + state.shape[-1])


def clone_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of t in a copy of its whole pool (same strides, the pad copied too)."""
    pool = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage().clone())
    return pool.as_strided(t.shape, t.stride(), t.storage_offset())
