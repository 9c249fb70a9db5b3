"""Argument checks shared by the kernel wrappers: one clear ValueError naming the argument.

Shape, dtype and device checks never synchronise with the GPU. Checks of the tree arrays'
contents (parents before children, node counts, offsets) read them on the host, so they
run only when the caller asks (`check_trees=True`, the default for direct calls); a serving
engine that builds the arrays itself and captures CUDA graphs passes False.
"""

from __future__ import annotations

import torch

from bole_cli.errors import InputError
from bole_cli.limits import MAX_TREE_NODES

ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(name: str, t, ndim: int, dtypes=None, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
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


def check_index_vector(name: str, t, length: int, device) -> torch.Tensor:
    check_tensor(name, t, 1, INDEX_DTYPES, device)
    check_shape(name, t, (length,))
    return t


def check_accepted(accepted, cu_seqlens: torch.Tensor, device, check_trees: bool) -> None:
    """accepted [B]: -1 (none) or a local node index of the request."""
    bsz = cu_seqlens.shape[0] - 1
    check_index_vector("accepted", accepted, bsz, device)
    if not check_trees:
        return
    sizes = (cu_seqlens[1:] - cu_seqlens[:-1]).cpu()
    acc = accepted.cpu()
    bad = (acc < -1) | (acc >= sizes)
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise InputError(f"accepted: request {b} accepts node {int(acc[b])}, outside -1..{int(sizes[b]) - 1}")
