"""Attention of a step's queries to each request's committed keys, split along the keys
(flash-decoding), read in place from the KV cache (docs/design.md §8, "The decode step").

A decode step has one query per request (G rows per KV head), so a kernel that gives each
(request, KV head) one program reads a 4096-key cache with 4 programs at batch 1, a few
percent of the GPU's bandwidth. Here the keys are cut into `splits` chunks, each program
keeps its chunk's running max, sum and weighted values (online softmax, float32), and a
second pass merges the chunks exactly. The result comes with its log-sum-exp, so a tree
verify merges it with its small masked tree part (runtime/attention.split_tree_attention).

Queries q [B, H_kv, R, D] (R rows per KV head: the GQA group of each query token); caches
[S, H_kv, L_max, D] (one layer's); request b reads slot slots[b]'s first used[b] keys.
Rows of a request with no key get out 0 and lse -inf; slots outside the pool read nothing
and give NaN; used[b] past the cache length reads the whole slot, never beyond.

A tree verify's own keys sit in the cache right after the committed ones (its scratch), so
the tree part is read here too when `tree_bias` [B, 1|H_kv, R, T] is given: row r also sees
key used[b] + c, for c < T, with tree_bias[b, ., r, c] added to its score (0 for an
ancestor or itself, -inf otherwise). The whole attention is then this kernel, where the
tree part alone took six or more launches (docs/design.md §8).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from bole_cli.errors import InputError
from bole_cli.kernels.validate import (ACTIVATION_DTYPES, check_index_vector, check_last_contiguous, check_tensor,
                                       power_of_two)

TARGET_PROGRAMS = 264  # about two programs per SM of an H100/H200: enough splits to fill it
MIN_SPLIT_KEYS = 256
MERGE_CHUNKS = 16  # chunks the merge weighs at a time ([16, D] float32 tiles)
MAX_TILE = 128  # keys or rows a tile a launch may ask for (D = 256 tiles past it overflow shared memory)
MAX_GRID_AXIS = 65535  # CUDA's programs on a grid's second and third axes (the merge's second: the pairs)
# A launch: (keys a tile, warps, software-pipeline stages, target programs, fewest keys a
# split, rows a tile). The rule (attention_launch) by the rows a (request, KV head) and the
# programs their 16-row tiles make before any split, from the H200's sweep
# (experiments/README.md S9-f; geomean 0.81 of the launch before it, none slower than 1.03):
FEW_ROWS = 32  # a decode's, a drafter level's, a tree's of up to 8 tokens at a GQA group of 4
FEW_PROGRAMS = 64  # at most this many 16-row tiles (S9-f: fewer; 64 itself timed in S17-a: 0.83-0.89)
FEW_ROWS_LAUNCH = (64, 4, 3, 128, 128, 16)  # and at most FEW_PROGRAMS tiles (over few keys)
MANY_ROWS_LAUNCH = (64, 4, 2, TARGET_PROGRAMS // 2, 128, 16)  # many rows (a verify of 32 tokens at batch 4)
FULL_LAUNCH = (32, 8, 3, TARGET_PROGRAMS, MIN_SPLIT_KEYS, 64)  # many rows whose tiles fill the GPU (batch 16)
# 17-64 rows over many keys: one tile holds all of a (request, KV head)'s rows, so its keys
# are read once, not once a 16-row tile (a tree or drafter level of 5-8 tokens at a GQA
# group of 4, 3-10 at Qwen3.5-27B's 6), from an H100's sweep (experiments/README.md S15-b:
# geomean 0.94 of the rule before over every 2-8-token cell of 9B and 27B, 0.45-1.05 a cell)
ONE_TILE_ROWS_LAUNCHES = ((32, (32, 4, 3, 128, 128, 32)), (64, (32, 8, 3, 128, 128, 64)))  # (most rows, launch)
# keys the 16-row tiles past a pair's first read again over the batch ((tiles - 1) x batch x
# keys a request) from which one tile pays (below it, more programs do): 32768 for 17-32 rows
# (two tiles), half that for 33-48 (27B's 8-token drafter level and tree read keys three
# times; experiments/README.md S16-a), a third for 49-64 (9B's trees of 13-16 tokens, 27B's
# of 9-10; S17-a: the fastest launch swept wherever it takes one tile, 0.56-0.87 of S9-f's
# rule). Judged on max_keys, the bound a caller gives (a step's bucket), so a bucket well
# above the keys actually read takes one tile a little early
ONE_TILE_MIN_KEYS = 32768
# ... from half as many for a tree of two tiles (27B's 4-token and 9B's 8-token trees at
# 16384-16512 keys read again: 0.90-0.98 of the 16-row tiles, one cell 1.07; drafter levels of
# the same rows and keys 0.98-1.20, so they keep the whole), a quarter for 33-64 rows over
# ONE_TILE_MIN_BATCH requests or more (27B's 8-token level and tree at batch 4 over a 1k
# cache: 0.78-0.85; at batch 1 the one tile loses, 1.12-1.25 at kv 4096). Why trees differ
# is not measured. Judged on the H100's and the H200's sweeps: experiments/README.md S23-a
ONE_TILE_MIN_BATCH = 4
# Over FULL_MIN_KEYS keys or more, FULL_LAUNCH's 64-row tiles (keys read a quarter as often;
# 33-64 rows take one tile first, where it applies) beyond the programs rule: where a pair
# has FULL_MIN_ROW_TILES 16-row
# tiles (27B's tree of 32 tokens, 192 rows: 0.77-0.83 of the rule before at batch 4; 96 and
# 128 rows stay, where the rule before wins by 5-11%) or, past one 64-row tile, its tiles
# make at most FEW_PROGRAMS programs (batch 1: 0.47-0.91 at kv 4096 and 16384, 9B on the H200
# and an H100, 27B on an H100; exactly 64 rows lost 1.27x at kv 4096, S17-a). Over a 1k cache
# the split's merge costs more than the reads it saves (up to 1.49x at 128 rows, batch 1;
# 1.17x at 256 rows, batch 4). experiments/README.md S16-b
FULL_MIN_ROW_TILES = 12
FULL_MIN_KEYS = 4096
# the rule's name in a measured profile's provenance (runtime.timer), so a profile measured
# under an earlier rule says so
LAUNCH_RULE = (f"rows and programs (S9-f); one tile for {FEW_ROWS_LAUNCH[5] + 1}-{ONE_TILE_ROWS_LAUNCHES[-1][0]} "
               f"rows from {ONE_TILE_MIN_KEYS} keys read again, half for a two-tile tree, a quarter past 32 rows at "
               f"{ONE_TILE_MIN_BATCH} requests or more (S15-b, S16-a, S23-a); 64-row tiles from "
               f"{FULL_MIN_ROW_TILES} tiles of 16 or few programs past 64 rows, over {FULL_MIN_KEYS} keys "
               f"(S16-b, S17-a); at most {FEW_PROGRAMS} tiles few (S17-a)")


@triton.jit(do_not_specialize=["tree_t"])
def _cache_attention_part(q, k_cache, v_cache, slots, used, o_part, m_part, l_part, out, lse, tree_bias, tree_cu,
                          n_slots, l_max, rows, split_keys, scale, s_qb, s_qh, s_qt, s_qg, s_kn, s_kh, s_kl, s_vn,
                          s_vh, s_vl, s_ob, s_oh, s_ot, s_og, s_lb, s_lh, group, tree_t, s_tb, s_th, s_tr,
                          H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, BL: tl.constexpr,
                          FINAL: tl.constexpr, TREE: tl.constexpr, SIZES: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // H
    h = bh % H
    n_splits = tl.num_programs(1)
    offs_r = tl.program_id(2) * BR + tl.arange(0, BR)
    rmask = offs_r < rows
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    slot = tl.load(slots + b).to(tl.int64)
    in_pool = (slot >= 0) & (slot < n_slots)
    safe = tl.where(in_pool, slot, 0)
    base = tl.load(used + b).to(tl.int32)
    tree_n = tree_t  # the tree's keys (0: no tree); its own node count when the offsets are given
    if SIZES:
        tree_n = tl.maximum(tl.minimum(tl.load(tree_cu + b + 1) - tl.load(tree_cu + b), tree_t), 0)
    n_keys = tl.minimum(tl.where(in_pool, base + tree_n, 0), l_max)  # never past the cache
    start = split * split_keys
    end = tl.minimum(start + split_keys, n_keys)
    node, g = offs_r // group, offs_r % group  # row r: query token r // group, its head r % group
    qp = q + b.to(tl.int64) * s_qb + h * s_qh + (node * s_qt + g * s_qg)[:, None] + offs_d[None, :]
    qt = tl.load(qp, mask=rmask[:, None] & dmask[None, :], other=0.0)
    kb = k_cache + safe * s_kn + h * s_kh
    vb = v_cache + safe * s_vn + h * s_vh
    m = tl.full((BR,), float("-inf"), tl.float32)
    l = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    for j in range(start, end, BL):
        offs_l = j + tl.arange(0, BL)
        lmask = offs_l < end
        kt = tl.load(kb + offs_l[:, None] * s_kl + offs_d[None, :], mask=lmask[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)).to(tl.float32) * scale
        if TREE:  # the tree's keys: each row's ancestors and itself (the bias is 0 there, -inf elsewhere)
            col = offs_l - base
            tb = tree_bias + b.to(tl.int64) * s_tb + h * s_th + offs_r[:, None] * s_tr + col[None, :]
            s += tl.load(tb, mask=rmask[:, None] & (lmask & (col >= 0))[None, :], other=0.0).to(tl.float32)
        s = tl.where(lmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet (masked tree keys)
        alpha = tl.exp(m - m_use)
        p = tl.exp(s - m_use[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        vt = tl.load(vb + offs_l[:, None] * s_vl + offs_d[None, :], mask=lmask[:, None] & dmask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt).to(tl.float32)
        m = m_new
    poison = tl.where(in_pool, 0.0, float("nan"))
    if FINAL:  # one split: normalise here
        has = l > 0
        o = tl.where(has[:, None], acc / tl.where(has, l, 1.0)[:, None], 0.0) + poison
        op = out + b.to(tl.int64) * s_ob + h * s_oh + (node * s_ot + g * s_og)[:, None] + offs_d[None, :]
        tl.store(op, o.to(out.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])
        ls = tl.where(has, m + tl.log(tl.where(has, l, 1.0)), float("-inf")) + poison
        tl.store(lse + b.to(tl.int64) * s_lb + h * s_lh + offs_r, ls, mask=rmask)
    else:
        part = (bh.to(tl.int64) * n_splits + split) * rows + offs_r
        tl.store(o_part + part[:, None] * BD + offs_d[None, :], acc, mask=rmask[:, None])
        tl.store(m_part + part, m, mask=rmask)
        tl.store(l_part + part, l, mask=rmask)


@triton.jit
def _cache_attention_merge(o_part, m_part, l_part, out, lse, slots, n_slots, rows, n_splits,
                           s_ob, s_oh, s_ot, s_og, s_lb, s_lh, group,
                           H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, NSP: tl.constexpr, SB: tl.constexpr):
    """Row r of (request, KV head) bh: its chunks' partial results merged exactly. Every
    chunk's max and sum load at once (NSP >= n_splits), the weighted values SB chunks at a
    time: a long cache's 64 chunks cost a few dependent loads, not one each."""
    r = tl.program_id(0)  # rows on the first axis: CUDA's others stop at 65535
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    slot = tl.load(slots + b).to(tl.int64)
    poison = tl.where((slot >= 0) & (slot < n_slots), 0.0, float("nan"))
    first = bh.to(tl.int64) * n_splits * rows + r  # chunk c's row r: first + c * rows
    chunks = tl.arange(0, NSP)
    cmask = chunks < n_splits
    m = tl.load(m_part + first + chunks * rows, mask=cmask, other=float("-inf"))
    mx = tl.max(m, axis=0)
    safe_mx = tl.where(mx == float("-inf"), 0.0, mx)
    total = tl.sum(tl.exp(m - safe_mx) * tl.load(l_part + first + chunks * rows, mask=cmask, other=0.0), axis=0)
    offs_d = tl.arange(0, BD)
    acc = tl.zeros((BD,), tl.float32)
    for c0 in range(0, n_splits, SB):
        cs = c0 + tl.arange(0, SB)
        smask = cs < n_splits
        w = tl.exp(tl.load(m_part + first + cs * rows, mask=smask, other=float("-inf")) - safe_mx)
        o = tl.load(o_part + (first + cs * rows)[:, None] * BD + offs_d[None, :], mask=smask[:, None], other=0.0)
        acc += tl.sum(w[:, None] * o, axis=0)
    has = total > 0
    o = tl.where(has, acc / tl.where(has, total, 1.0), 0.0) + poison
    node, g = r // group, r % group
    op = out + b.to(tl.int64) * s_ob + h * s_oh + node * s_ot + g * s_og + offs_d
    tl.store(op, o.to(out.dtype.element_ty), mask=offs_d < D)
    ls = tl.where(has, safe_mx + tl.log(tl.where(has, total, 1.0)), float("-inf")) + poison
    tl.store(lse + b.to(tl.int64) * s_lb + h * s_lh + r, ls)


def attention_splits(batch: int, kv_heads: int, row_blocks: int, max_keys: int,
                     target: int = TARGET_PROGRAMS, min_keys: int = MIN_SPLIT_KEYS) -> int:
    """Chunks along the keys: enough programs to fill the GPU (`target` of them), no chunk
    under `min_keys` keys (a pure function of the shapes, so a CUDA graph keeps it)."""
    programs = max(1, batch * kv_heads * row_blocks)
    want = max(1, -(-target // programs))
    return max(1, min(want, -(-max_keys // min_keys)))


def one_tile_min_keys(batch: int, row_tiles: int, tree: bool) -> int:
    """The keys `row_tiles` 16-row tiles would read again over the batch from which one tile
    pays: ONE_TILE_MIN_KEYS, a quarter of it for three or four tiles over ONE_TILE_MIN_BATCH
    requests or more, half for a tree of two tiles (the sweeps' three-tile trees under
    ONE_TILE_MIN_BATCH lose with one tile on both sides of half: they keep the whole)."""
    if row_tiles >= 3 and batch >= ONE_TILE_MIN_BATCH:
        return ONE_TILE_MIN_KEYS // 4
    return ONE_TILE_MIN_KEYS // 2 if tree and row_tiles == 2 else ONE_TILE_MIN_KEYS


def attention_launch(batch: int, kv_heads: int, rows: int, max_keys: int,
                     tree: bool = False) -> tuple[int, int, int, int, int, int]:
    """The default launch for `rows` query rows a (request, KV head) over up to `max_keys`
    keys a request (`tree`: a verify's, with its tree mask). 17-64 rows where
    16-row tiles would read at least one_tile_min_keys keys again over the batch: the
    ONE_TILE_ROWS_LAUNCHES launch that holds them all in one tile.
    64 rows or more: FULL_LAUNCH (64 rows a tile, the keys split to fill the GPU) where the
    16-row tiles alone make TARGET_PROGRAMS programs, or over FULL_MIN_KEYS keys where a pair
    has FULL_MIN_ROW_TILES of them or, past 64 rows, they make at most FEW_PROGRAMS programs.
    Else FEW_ROWS_LAUNCH for few rows or at most FEW_PROGRAMS programs, MANY_ROWS_LAUNCH for
    the rest."""
    row_tiles = -(-rows // 16)
    if (row_tiles - 1) * batch * max_keys >= one_tile_min_keys(batch, row_tiles, tree):
        for most, launch in ONE_TILE_ROWS_LAUNCHES:
            if FEW_ROWS_LAUNCH[5] < rows <= most:
                return launch
    tiles = batch * kv_heads * row_tiles
    few_programs = tiles <= FEW_PROGRAMS
    # FULL's 64-row tiles only where one fills (33-63 rows: one tile above, else 16-row tiles)
    fills = rows >= FULL_LAUNCH[5] and tiles >= TARGET_PROGRAMS
    # ... or, past one of them, where they cut the keys a long cache reads again
    saves_reads = (rows > FULL_LAUNCH[5] and max_keys >= FULL_MIN_KEYS
                   and (row_tiles >= FULL_MIN_ROW_TILES or few_programs))
    if fills or saves_reads:
        return FULL_LAUNCH
    return FEW_ROWS_LAUNCH if rows <= FEW_ROWS or few_programs else MANY_ROWS_LAUNCH


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    used: torch.Tensor, *, max_keys: Optional[int] = None, scale: Optional[float] = None,
                    tree_bias: Optional[torch.Tensor] = None, tree_cu: Optional[torch.Tensor] = None,
                    launch: Optional[tuple[int, int, int, int, int, int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H_kv, R, D] in q's dtype, lse [B, H_kv, R] float32) of q against the first
    used[b] keys of slot slots[b]. max_keys: a bound on the keys read (default the cache
    length), which sets the number of key chunks and the default launch (give the step's
    bucket so a graph holds them).
    tree_bias [B, 1|H_kv, R, T] (last dimension contiguous): keys used[b] .. used[b] + T - 1
    too, tree_bias[b, ., r, c] added to row r's score of key used[b] + c; with tree_cu [B + 1]
    (the packed forest's offsets) only request b's own tree_cu[b + 1] - tree_cu[b] of them
    (the rest of its padded columns is never read: nothing wrote it this step). max_keys must
    cover used[b] + its tree keys.

    q may also be [B, H_kv, T, G, D] (T query tokens of G heads each, any strides: a
    verify's q as [B, T, H_kv, G, D] transposed, no copy), row r = t G + g; out then has
    that shape too, a view of a [B, T, H_kv, G, D] buffer (the token-major rows o_proj
    reads, again no copy).

    launch: (keys a tile, warps, pipeline stages, target programs, fewest keys a split, rows
    a tile), default attention_launch's; keys and rows a tile powers of two from 16 to
    MAX_TILE, warps a power of two up to 16, stages 1-4, the other two positive; a launch
    that would split the keys past CUDA's 65535 programs on that axis is refused."""
    if launch is not None:
        ok = isinstance(launch, tuple) and len(launch) == 6 and all(isinstance(n, int) for n in launch)
        keys_tile, warps, stages, target, min_keys, rows_tile = launch if ok else (0,) * 6
        if not (ok and power_of_two(keys_tile) and keys_tile >= 16 and power_of_two(warps) and warps <= 16
                and 1 <= stages <= 4 and target >= 1 and min_keys >= 1 and power_of_two(rows_tile)
                and 16 <= rows_tile <= MAX_TILE and keys_tile <= MAX_TILE):
            raise InputError(f"launch: {launch!r} must be (keys a tile: a power of two 16-{MAX_TILE}, warps: a "
                             "power of two <= 16, stages 1-4, target programs >= 1, fewest keys a split >= 1, "
                             f"rows a tile: a power of two 16-{MAX_TILE})")
    five = isinstance(q, torch.Tensor) and q.dim() == 5
    check_tensor("q", q, 5 if five else 4, ACTIVATION_DTYPES)
    check_last_contiguous("q", q)
    dev = q.device
    if five:  # rows r = t G + g of token t's head g
        bsz, hkv, tokens, group, d = q.shape
        rows, q_rows = tokens * group, (q.stride(2), q.stride(3))
    else:  # one token of R rows
        bsz, hkv, rows, d = q.shape
        group, q_rows = max(rows, 1), (0, q.stride(2))
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, 4, (q.dtype,), dev)
        check_last_contiguous(name, c)
        if c.shape[1] != hkv or c.shape[3] != d:
            raise InputError(f"{name}: expected [S, {hkv}, L, {d}] for q {tuple(q.shape)}, got {tuple(c.shape)}")
    if k_cache.shape != v_cache.shape:
        raise InputError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}")
    slots = check_index_vector("slots", slots, bsz, dev)
    used = check_index_vector("used", used, bsz, dev)
    n_slots, _, lmax, _ = k_cache.shape
    tree_t = 0
    if tree_bias is not None:
        check_tensor("tree_bias", tree_bias, 4, ACTIVATION_DTYPES, dev)
        if (tree_bias.shape[0] != bsz or tree_bias.shape[1] not in (1, hkv) or tree_bias.shape[2] != rows
                or tree_bias.shape[3] < 1):
            raise InputError(f"tree_bias: expected [{bsz}, 1 or {hkv}, {rows}, T] for q {tuple(q.shape)}, "
                             f"got {tuple(tree_bias.shape)}")
        check_last_contiguous("tree_bias", tree_bias)
        tree_t = tree_bias.shape[3]
    if tree_cu is not None:
        if tree_bias is None:
            raise InputError("tree_cu: only with tree_bias (the tree's node offsets)")
        tree_cu = check_index_vector("tree_cu", tree_cu, bsz + 1, dev)
    max_keys = lmax if max_keys is None else min(int(max_keys), lmax)
    scale = d ** -0.5 if scale is None else float(scale)
    if five:
        out = torch.empty(bsz, tokens, hkv, group, d, device=dev, dtype=q.dtype).transpose(1, 2)
        o_rows = (out.stride(2), out.stride(3))
    else:
        out = torch.empty(bsz, hkv, rows, d, device=dev, dtype=q.dtype)
        o_rows = (0, out.stride(2))
    lse = torch.empty(bsz, hkv, rows, device=dev, dtype=torch.float32)
    if bsz == 0 or rows == 0:
        return out, lse
    bd = triton.next_power_of_2(d)
    tree = tree_bias is not None
    keys_tile, warps, stages, target, min_keys, br = launch or attention_launch(bsz, hkv, rows, max_keys, tree)
    row_blocks = triton.cdiv(rows, br)
    splits = attention_splits(bsz, hkv, row_blocks, max(max_keys, 1), target, min_keys)
    if max(splits, row_blocks) > MAX_GRID_AXIS or (splits > 1 and bsz * hkv > MAX_GRID_AXIS):
        raise InputError(f"launch: {splits} key chunks, {row_blocks} row tiles and {bsz * hkv} (request, KV head) "
                         f"pairs: past CUDA's {MAX_GRID_AXIS} programs on a grid axis (raise the fewest keys a "
                         "split or the rows a tile)")
    split_keys = triton.cdiv(triton.cdiv(max(max_keys, 1), splits), keys_tile) * keys_tile
    final = splits == 1
    n_part = 1 if final else bsz * hkv * splits * rows
    o_part = torch.empty(n_part, bd, device=dev, dtype=torch.float32)
    m_part = torch.empty(n_part, device=dev, dtype=torch.float32)
    l_part = torch.empty(n_part, device=dev, dtype=torch.float32)
    strides = (out.stride(0), out.stride(1), *o_rows, lse.stride(0), lse.stride(1), group)
    tb = tree_bias if tree_bias is not None else lse  # never read without a tree
    tb_strides = ((tb.stride(0), tb.stride(1) if tb.shape[1] > 1 else 0, tb.stride(2)) if tree_bias is not None
                  else (0, 0, 0))
    _cache_attention_part[(bsz * hkv, splits, row_blocks)](
        q, k_cache, v_cache, slots, used, o_part, m_part, l_part, out, lse, tb, tree_cu if tree_cu is not None else slots,
        n_slots, lmax, rows, split_keys, scale, q.stride(0), q.stride(1), *q_rows,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), *strides, tree_t, *tb_strides, H=hkv, D=d, BD=bd, BR=br, BL=keys_tile, FINAL=final,
        TREE=tree, SIZES=tree_cu is not None, num_warps=warps, num_stages=stages)
    if not final:
        _cache_attention_merge[(rows, bsz * hkv)](
            o_part, m_part, l_part, out, lse, slots, n_slots, rows, splits, *strides, H=hkv, D=d, BD=bd,
            NSP=triton.next_power_of_2(splits), SB=MERGE_CHUNKS, num_warps=4)
    return out, lse
