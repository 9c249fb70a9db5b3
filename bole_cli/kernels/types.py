"""The kernels' result and row types (docs/design.md §3): what tree_verify returns and what
a deferred commit keeps beside the state."""

from __future__ import annotations

from typing import NamedTuple

import torch

from bole_cli.errors import InputError
from bole_cli.limits import MAX_PENDING_ROWS


class VerifyResult(NamedTuple):
    """Outputs of a tree verify: o [N, HV, V], the factors u [N, HV, V] and log_p [N, HV]."""

    o: torch.Tensor
    u: torch.Tensor
    log_p: torch.Tensor


class PendingPath(NamedTuple):
    """A deferred state write (docs/design.md §2, "Deferred commit"): per state slot, the
    accepted nodes committed since the slot's state was last written, as factors, in path
    order. k [S, L, H, K] float32 keys as the verify uses them (unit keys with use_qk_l2norm), u
    [S, L, HV, V] float32, log_p [S, L, HV] float32 (log decay from the written state down
    the path), count [S, HV] int32 (rows in use, the same for every head). A leading layer
    dimension on all four holds every GDN layer. The slot's true state is
    exp(logP_end) S + sum_j exp(logP_end - logP_j) u_j k_j^T, logP_end the last row's."""

    k: torch.Tensor
    u: torch.Tensor
    log_p: torch.Tensor
    count: torch.Tensor


def new_pending(state: torch.Tensor, rows: int, key_heads: int, dtype=torch.float32) -> PendingPath:
    """Empty pending rows (count 0) for a state pool [S, HV, V, K] (or [L, S, HV, V, K]):
    `rows` per slot, for keys of `key_heads` heads; the kernels take float32 factors. Costs
    rows * (H K + HV V + HV) * 4 bytes a slot and layer (9B, 16 rows: 0.38 MiB beside the
    state's 2 MiB)."""
    *lead, slots, hv, vdim, kdim = state.shape
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_PENDING_ROWS:
        raise InputError(f"rows: expected an int in 1..{MAX_PENDING_ROWS}, got {rows!r}")
    if isinstance(key_heads, bool) or not isinstance(key_heads, int) or key_heads < 1 or hv % key_heads:
        raise InputError(f"key_heads: expected a divisor of the state's {hv} value heads, got {key_heads!r}")
    kw = dict(device=state.device, dtype=dtype)
    return PendingPath(torch.zeros(*lead, slots, rows, key_heads, kdim, **kw),
                       torch.zeros(*lead, slots, rows, hv, vdim, **kw),
                       torch.zeros(*lead, slots, rows, hv, **kw),
                       torch.zeros(*lead, slots, hv, device=state.device, dtype=torch.int32))
