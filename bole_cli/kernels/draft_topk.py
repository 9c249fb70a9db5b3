"""The top-k token ids of each row of a drafter level's logits, in two launches.

Why: a draft level needs only the ids of its top-k logits (the softmax is monotonic), and
torch.topk on a row of 32k-248k logits is a radix select of about fifteen launches, a
noticeable share of a 32k head's level (experiments/NOTES.md "The drafter's top-k in two
launches"). This is one pass over the logits in chunks (each chunk's top k) and one merge
of the chunks' candidates per row, which applies a reduced draft vocabulary's hot-token map
(SGLang's --speculative-token-map).

Order: by value, descending; equal values by the lower id (a stable descending sort).
NaN ranks as +inf. Reference: `reference.draft_topk_ref`.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import (ACTIVATION_DTYPES, INDEX_DTYPES, check_last_contiguous, check_shape,
                                       check_tensor)
from bole_cli.limits import DRAFT_TOPK_MAX_K

CHUNK = 4096  # logits one program of the first pass ranks (16 KiB of float32 in registers)
NO_ID = tl.constexpr(2 ** 31 - 1)  # a candidate slot no logit filled (a chunk shorter than k)


@triton.jit
def _take_topk(x, ids, live, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of x where live, one by one, equal values by the lower id: (values, ids)
    in slots 0..K-1 of KP, NO_ID where fewer than K were live."""
    slot = tl.arange(0, KP)
    best_val = tl.full([KP], float("-inf"), tl.float32)
    best_id = tl.full([KP], NO_ID, tl.int32)
    for j in tl.static_range(K):
        top = tl.max(tl.where(live, x, float("-inf")), 0)
        pick = tl.min(tl.where(live & (x == top), ids, NO_ID), 0)
        best_val = tl.where(slot == j, top, best_val)
        best_id = tl.where(slot == j, pick, best_id)
        live = live & (ids != pick)
    return best_val, best_id


@triton.jit
def _chunk_topk_kernel(logits, s_row, vocab, cand_val, cand_id, n_chunks,
                       K: tl.constexpr, KP: tl.constexpr, CHUNK: tl.constexpr):
    """Chunk c of row r: its k largest logits and their ids into cand_*[r, c, :k]."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    ids = c * CHUNK + tl.arange(0, CHUNK)
    live = ids < vocab
    x = tl.load(logits + row * s_row + ids, mask=live, other=0.0).to(tl.float32)
    x = tl.where(x == x, x, float("inf"))  # NaN ranks as +inf
    best_val, best_id = _take_topk(x, ids, live, K, KP)
    slot = tl.arange(0, KP)
    out = (row * n_chunks + c) * K + slot
    tl.store(cand_val + out, best_val, mask=slot < K)
    tl.store(cand_id + out, best_id, mask=slot < K)


@triton.jit
def _merge_topk_kernel(cand_val, cand_id, n_cand, token_map, out, s_out,
                       K: tl.constexpr, KP: tl.constexpr, NC: tl.constexpr, MAPPED: tl.constexpr):
    """Row r's k best of its n_cand candidates, ids mapped through token_map when MAPPED."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NC)
    ids = tl.load(cand_id + row * n_cand + i, mask=i < n_cand, other=NO_ID)
    live = ids != NO_ID
    x = tl.load(cand_val + row * n_cand + i, mask=live, other=float("-inf"))
    _, best_id = _take_topk(x, ids, live, K, KP)
    slot = tl.arange(0, KP)
    keep = slot < K
    if MAPPED:
        # an id no candidate filled (none can be, k <= vocab) reads nothing
        tok = tl.load(token_map + best_id, mask=keep & (best_id != NO_ID), other=0).to(tl.int64)
    else:
        tok = best_id.to(tl.int64)
    tl.store(out + row * s_out + slot, tok, mask=keep)


def draft_topk(logits: torch.Tensor, k: int, token_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """logits [n, vocab] (last dim contiguous) -> int64 ids [n, k] of each row's k largest,
    in descending order, equal logits by the lower id (torch.topk's ids, where it has no
    ties; it promises no order among equals); token_map [vocab]
    (int32 or int64): the ids returned are token_map[id] (a reduced draft vocabulary's
    token ids). 1 <= k <= min(vocab, limits.DRAFT_TOPK_MAX_K)."""
    check_tensor("logits", logits, 2, ACTIVATION_DTYPES)
    n, vocab = logits.shape
    if not isinstance(k, int) or not 1 <= k <= min(vocab, DRAFT_TOPK_MAX_K):
        raise InputError(f"k: expected 1..{min(vocab, DRAFT_TOPK_MAX_K)} (the vocabulary and "
                         f"limits.DRAFT_TOPK_MAX_K), got {k!r}")
    check_last_contiguous("logits", logits)
    if token_map is not None:
        check_tensor("token_map", token_map, 1, INDEX_DTYPES, logits.device)
        check_shape("token_map", token_map, (vocab,))
        token_map = token_map.contiguous()
    out = torch.empty(n, k, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    kp = triton.next_power_of_2(k)
    n_chunks = triton.cdiv(vocab, CHUNK)
    cand_val = torch.empty(n, n_chunks * k, dtype=torch.float32, device=logits.device)
    cand_id = torch.empty(n, n_chunks * k, dtype=torch.int32, device=logits.device)
    _chunk_topk_kernel[(n, n_chunks)](logits, logits.stride(0), vocab, cand_val, cand_id, n_chunks,
                                      K=k, KP=kp, CHUNK=CHUNK, num_warps=8)
    mapped = token_map is not None
    _merge_topk_kernel[(n,)](cand_val, cand_id, n_chunks * k, token_map if mapped else cand_id, out,
                             out.stride(0), K=k, KP=kp, NC=triton.next_power_of_2(n_chunks * k),
                             MAPPED=mapped, num_warps=4)
    return out
