"""Argument checks shared by the kernel wrappers: one clear ValueError naming the argument.

Types, shapes, dtypes, devices, launch configs and `scale` are checked on every call and
never synchronise with the GPU. Checks of the index arrays' contents (parents before
children, node counts, offsets, pool slots, accepted nodes, duplicate commit slots) read
them on the host, so they run only when the caller asks (`check_trees=True`, the default
for direct calls); a serving engine that builds the arrays itself and captures CUDA graphs
passes False, and the kernels then guard the pool themselves (docs/design.md §3).

The kernels index every 1-D argument as raw memory (element i at ptr + i), while the host
checks read logical values: `contiguous_vector` copies a strided vector, so both agree.
"""

from __future__ import annotations

import math
import numbers
from typing import Mapping, NamedTuple, Optional

import torch

from bole_cli.errors import InputError
from bole_cli.memory import FLOAT_DTYPES
from bole_cli.limits import KERNEL_STATE_DTYPES, MAX_TREE_NODES, VERIFY_PRECISIONS

ACTIVATION_DTYPES = tuple(getattr(torch, name) for name in FLOAT_DTYPES)  # memory.FLOAT_DTYPES
STATE_DTYPES = tuple(getattr(torch, name) for name in KERNEL_STATE_DTYPES)
INDEX_DTYPES = (torch.int32, torch.int64)
FACTOR_DTYPES = (torch.float32,)  # the verify's u and log_p
GATE_DTYPES = (torch.float32,) + ACTIVATION_DTYPES[1:]  # g, beta: float32 or 16-bit activations


def check_tensor(name: str, t, ndim: int, dtypes=None, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_meta:
        raise InputError(f"{name}: a meta tensor has no data to compute on")
    if t.dim() != ndim:
        raise InputError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise InputError(f"{name}: dtype {str(t.dtype).replace('torch.', '')} not supported (use {allowed})")
    if device is not None and t.device != device:
        raise InputError(f"{name}: on {t.device}, expected {device} like the other inputs")
    return t


def check_shape(name: str, t: torch.Tensor, expected: tuple) -> None:
    if tuple(t.shape) != tuple(expected):
        raise InputError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def check_last_contiguous(name: str, t: torch.Tensor) -> None:
    if t.numel() and t.stride(-1) != 1:
        raise InputError(f"{name}: the last dimension must be contiguous (stride 1), got strides {t.stride()}")


def check_forest(parents: torch.Tensor, cu_seqlens: torch.Tensor, n: int) -> int:
    """Host-side check of the packed forest: offsets, sizes and parents[i] < i per request.
    Returns the largest tree's node count."""
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    par = parents.detach().to("cpu", torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != n:
        raise InputError(f"cu_seqlens: must start at 0 and end at N={n}, got {cu[0].item()}..{cu[-1].item()}")
    sizes = cu[1:] - cu[:-1]
    if bool((sizes < 0).any()):
        b = int(torch.nonzero(sizes < 0)[0])
        raise InputError(f"cu_seqlens: offsets decrease at request {b}")
    if bool((sizes > MAX_TREE_NODES).any()):
        b = int(torch.nonzero(sizes > MAX_TREE_NODES)[0])
        raise InputError(f"cu_seqlens: request {b} has {int(sizes[b])} nodes, more than {MAX_TREE_NODES}")
    local = torch.arange(n) - torch.repeat_interleave(cu[:-1], sizes)
    bad = (par < -1) | (par >= local)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        b = int(torch.searchsorted(cu, torch.tensor(i), right=True)) - 1
        raise InputError(
            f"parents: node {i} (request {b}, local {int(local[i])}) has parent {int(par[i])}; "
            f"parents must be -1 or a local index before the node"
        )
    return int(sizes.max()) if sizes.numel() else 0


def check_nonempty(name: str, t: torch.Tensor, dims: Mapping[int, str]) -> None:
    """Feature dimensions (heads, key / value / channel sizes) must not be empty; node and
    request counts may be (nothing to do)."""
    for dim, label in dims.items():
        if t.shape[dim] == 0:
            raise InputError(f"{name}: dimension {label} is empty, got shape {tuple(t.shape)}")


def contiguous_vector(t: torch.Tensor) -> torch.Tensor:
    """The kernels read a 1-D argument as raw memory: a strided view is copied (on the
    device, no synchronisation), so element i is where the kernel looks for it."""
    return t if t.is_contiguous() else t.contiguous()


def check_index_vector(name: str, t, length: int, device) -> torch.Tensor:
    """Returns the vector itself, or a contiguous copy of a strided one (use the result)."""
    check_tensor(name, t, 1, INDEX_DTYPES, device)
    check_shape(name, t, (length,))
    return contiguous_vector(t)


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{name}: expected True or False, got {value!r}")
    return value


def check_scale(scale, kdim: int) -> float:
    """q's scale: None (dk^-0.5) or a finite real number (a NaN would poison every output)."""
    if scale is None:
        return float(kdim ** -0.5)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise InputError(f"scale: expected a finite number or None, got {scale!r}")
    return float(scale)


def check_distinct_elements(name: str, t: torch.Tensor) -> None:
    """An output whose elements do not overlap (no zero stride, no row inside another: an
    `expand`ed tensor would be written by several programs at once). Checked by strides, each
    dimension's step past the reach of the finer ones: stricter than torch, which refuses only
    zero strides, it also refuses a rare interleaved layout that shares no element."""
    reach = 0
    for stride, size in sorted((t.stride(d), t.shape[d]) for d in range(t.dim()) if t.shape[d] > 1):
        if stride <= reach:
            raise InputError(f"{name}: its elements overlap (strides {t.stride()}); give a tensor "
                             "that owns each element, e.g. torch.empty")
        reach += stride * (size - 1)


def check_out(out, n: int, hv: int, vdim: int, device) -> tuple:
    """tree_verify's `out=` (o, u, log_p): the kernels write them by row strides with the
    last dimension contiguous, so that is what they must be."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise InputError(f"out: expected (o, u, log_p), got {type(out).__name__}")
    o, u, log_p = out
    for name, t, shape, dtypes in (("out.o", o, (n, hv, vdim), ACTIVATION_DTYPES),
                                   ("out.u", u, (n, hv, vdim), (torch.float32,)),
                                   ("out.log_p", log_p, (n, hv), (torch.float32,))):
        check_tensor(name, t, len(shape), dtypes, device)
        check_shape(name, t, shape)
        check_last_contiguous(name, t)
        check_distinct_elements(name, t)
    return o, u, log_p


def check_pool_slots(state_indices: torch.Tensor, n_slots: int, check_trees: bool,
                     active: Optional[torch.Tensor] = None) -> None:
    """Every request's slot inside the pool [0, S) (host read: only with check_trees); with
    `active` (a commit's accepted >= 0), only the requests that use their slot, so padding
    rows that commit nothing may carry any slot. Without the check the kernels guard the
    pool themselves: docs/design.md §3."""
    if not check_trees or state_indices.numel() == 0:
        return
    idx = state_indices.detach().to("cpu", torch.int64)
    bad = (idx < 0) | (idx >= n_slots)
    if active is not None:
        bad &= active.detach().cpu()
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise InputError(f"state_indices: request {b} has slot {int(idx[b])}, outside the pool's "
                         f"{n_slots} slots (0..{n_slots - 1})")


def check_commit_slots(state_indices: torch.Tensor, n_slots: int, writes: torch.Tensor) -> None:
    """The slots of the requests that write (writes [B] bool: a commit's accepted >= 0) lie
    inside the pool, and no two of them share one (their programs would race). Host read:
    with check_trees only."""
    check_pool_slots(state_indices, n_slots, True, active=writes)
    idx = state_indices.detach().to("cpu", torch.int64)
    seen: dict[int, int] = {}
    for b in torch.nonzero(writes.detach().cpu()).flatten().tolist():
        slot = int(idx[b])
        if slot in seen:
            raise InputError(f"state_indices: requests {seen[slot]} and {b} both commit into slot {slot}")
        seen[slot] = b


def check_pool_rank(state) -> int:
    """A commit's state pool: [S, HV, V, K], or [L, S, HV, V, K] for every layer at once.
    Returns the number of leading layer dims (0 or 1)."""
    if not isinstance(state, torch.Tensor) or state.dim() not in (4, 5):
        raise InputError(f"state: expected [S, HV, V, K] or [L, S, HV, V, K], got "
                         f"{tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__}")
    return state.dim() - 4


def check_forest_vectors(state_indices, parents, cu_seqlens, n: int, device) -> tuple:
    """cu_seqlens [B+1], state_indices [B], parents [N]: (B, state_indices, parents,
    cu_seqlens), each contiguous (the kernels read them as raw memory)."""
    check_tensor("cu_seqlens", cu_seqlens, 1, None, device)
    bsz = cu_seqlens.shape[0] - 1
    if bsz < 0:
        raise InputError("cu_seqlens: needs at least one entry")
    return (bsz, check_index_vector("state_indices", state_indices, bsz, device),
            check_index_vector("parents", parents, n, device),
            check_index_vector("cu_seqlens", cu_seqlens, bsz + 1, device))


class CommitArgs(NamedTuple):
    """A commit's checked arguments (`check_commit`): the shape facts and the contiguous index vectors."""

    lead: tuple  # () or (L,): the leading layer dim
    n_slots: int
    hv: int
    vdim: int
    kdim: int
    n: int  # nodes
    h: int  # key heads
    bsz: int
    state_indices: torch.Tensor
    parents: torch.Tensor
    cu_seqlens: torch.Tensor
    accepted: torch.Tensor


def check_commit(state, state_indices, k, rows: Mapping[str, tuple], parents, cu_seqlens, accepted, use_qk_l2norm,
                 check_trees, *, every_slot_writes: bool = False) -> CommitArgs:
    """The commits' shared arguments: state [S, HV, V, K] (or [L, S, HV, V, K] with the same
    leading dim on k and every row tensor), k, the per-node rows each commit reads (name ->
    (tensor, dtypes); 3-D rows are [N, HV, V], 2-D rows [N, HV]: tree_commit's u and log_p,
    tree_commit_replay's v, g and beta), the forest and accepted; with check_trees, the
    forest, the accepted nodes and the slots of the requests that write (accepted >= 0, or
    all of them: every_slot_writes, a flush)."""
    nd = check_pool_rank(state)
    dev = state.device
    check_tensor("state", state, 4 + nd, STATE_DTYPES, dev)
    check_nonempty("state", state, {nd + 1: "HV (value heads)", nd + 2: "V (value dim)", nd + 3: "K (key dim)"})
    lead = tuple(state.shape[:nd])
    hv, vdim, kdim = state.shape[-3:]
    check_tensor("k", k, 3 + nd, ACTIVATION_DTYPES, dev)
    n, h = k.shape[nd], k.shape[nd + 1]
    check_shape("k", k, lead + (n, h, kdim))
    check_nonempty("k", k, {nd + 1: "H (key heads)"})
    if hv % h:
        raise InputError(f"k: {h} key heads do not divide the state's {hv} value heads")
    check_last_contiguous("state", state)
    check_last_contiguous("k", k)
    for name, (t, dtypes) in rows.items():
        per_value = name in ("u", "v")
        check_tensor(name, t, (3 if per_value else 2) + nd, dtypes, dev)
        check_shape(name, t, lead + ((n, hv, vdim) if per_value else (n, hv)))
        check_last_contiguous(name, t)
    bsz, state_indices, parents, cu_seqlens = check_forest_vectors(state_indices, parents, cu_seqlens, n, dev)
    check_flag("use_qk_l2norm", use_qk_l2norm)
    check_flag("check_trees", check_trees)
    if check_trees:
        check_forest(parents, cu_seqlens, n)
    accepted = check_accepted(accepted, cu_seqlens, dev, check_trees)
    if check_trees:
        check_commit_slots(state_indices, state.shape[nd], (accepted >= 0) | every_slot_writes)
    return CommitArgs(lead, state.shape[nd], hv, vdim, kdim, n, h, bsz, state_indices, parents, cu_seqlens,
                      accepted)


def check_accepted(accepted, cu_seqlens: torch.Tensor, device, check_trees: bool) -> torch.Tensor:
    """accepted [B]: -1 (none) or a local node index of the request. Returns it contiguous."""
    bsz = cu_seqlens.shape[0] - 1
    accepted = check_index_vector("accepted", accepted, bsz, device)
    if not check_trees:
        return accepted
    sizes = (cu_seqlens[1:] - cu_seqlens[:-1]).cpu()
    acc = accepted.cpu()
    bad = (acc < -1) | (acc >= sizes)
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise InputError(f"accepted: request {b} accepts node {int(acc[b])}, outside -1..{int(sizes[b]) - 1}")
    return accepted


# Launch-config values: every tile is a power of two (tl.arange); tiles that feed tl.dot
# are at least 16 wide (the tensor cores' smallest operand).
_DOT_TILES = {"tree_verify": ("BV", "BK", "BC"), "tree_commit": ("BV", "DP"), "tree_commit_replay": (),
              "tree_conv": (), "skinny_mm": ("BN", "BK")}
_PLAIN_TILES = {"tree_verify": ("RB",), "tree_commit": (), "tree_commit_replay": ("BV",), "tree_conv": ("BN", "BD"),
                "skinny_mm": ("SPLIT_K",)}
MAX_TILE = 1024


def power_of_two(v) -> bool:
    """A positive int power of two (not a bool): launch knobs and tile sizes."""
    return not isinstance(v, bool) and isinstance(v, int) and v >= 1 and not v & (v - 1)


def check_max_nodes(max_nodes) -> int:
    """A max_nodes promise: an int in 1..MAX_TREE_NODES."""
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= MAX_TREE_NODES:
        raise InputError(f"max_nodes: expected an int in 1..{MAX_TREE_NODES}, got {max_nodes!r}")
    return max_nodes


def check_max_depth(max_depth) -> Optional[int]:
    """A max_depth promise (the most strict ancestors of any node): None or an int in
    0..MAX_TREE_NODES - 1."""
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int)
                                  or not 0 <= max_depth < MAX_TREE_NODES):
        raise InputError(f"max_depth: expected an int in 0..{MAX_TREE_NODES - 1}, got {max_depth!r}")
    return max_depth


def check_config(kernel: str, config: Optional[Mapping]) -> None:
    """An explicit `config=`: a mapping whose values the kernel can compile (unknown keys
    are refused by launch_config, which knows the kernel's keys)."""
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise InputError(f"config: expected a dict of launch settings, got {type(config).__name__}")
    for key, value in config.items():
        if key in _DOT_TILES.get(kernel, ()) or key in _PLAIN_TILES.get(kernel, ()):
            low = 16 if key in _DOT_TILES.get(kernel, ()) else 1
            if not power_of_two(value) or not low <= value <= MAX_TILE:
                raise InputError(f"config: {key} must be a power of two in {low}..{MAX_TILE}, got {value!r}")
        elif key == "num_warps":
            if not power_of_two(value) or value > 32:
                raise InputError(f"config: num_warps must be a power of two in 1..32, got {value!r}")
        elif key in ("num_stages", "VSPLIT"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"config: {key} must be a positive int, got {value!r}")
        elif key == "precision":
            if value is not None and value not in VERIFY_PRECISIONS:
                raise InputError(f"config: precision must be None or one of {', '.join(VERIFY_PRECISIONS)}, "
                                 f"got {value!r}")
        elif key in ("GRAM16", "CHAIN", "SPLIT", "LEVELS"):
            if value not in (0, 1) or not isinstance(value, (bool, int)):
                raise InputError(f"config: {key} must be 0 or 1, got {value!r}")
