"""Split-key attention to the KV cache (kernels/cache_attention.py) against its float64
reference: any lengths (none, short, past the cache), several key chunks merged, GQA rows,
slots outside the pool; a tree verify's own keys after the committed ones under its tree
mask (rows that see nothing, trees past the cache's end, chunks of tree keys only), against
the reference and against the runtime's split tree attention. CPU: Triton's interpreter,
float32, and bfloat16 with the interpreter's bf16 dot made the GPU's (gpu_like_bf16_dots)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels.cache_attention import (FEW_PROGRAMS, FEW_ROWS_LAUNCH, FULL_LAUNCH, FULL_MIN_KEYS,
                                              FULL_MIN_ROW_TILES, MANY_ROWS_LAUNCH, ONE_TILE_MIN_BATCH,
                                              ONE_TILE_MIN_KEYS, ONE_TILE_ROWS_LAUNCHES, TARGET_PROGRAMS,
                                              attention_launch, attention_splits, cache_attention)
from bole_cli.kernels.reference_attention import cache_attention_ref

# the default; chunks of 16 keys (up to 40 of them: the merge's chunk loop runs three times
# over a power-of-two bound it masks); another tile, warps and stages
LAUNCHES = [None, (16, 4, 1, 264, 16, 16), (32, 2, 2, 528, 32, 32)]
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def case(seed, bsz, hkv, rows, d, lmax, lengths, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(bsz, hkv, rows, d, generator=g).to(dtype)
    k = torch.randn(bsz + 2, hkv, lmax, d, generator=g).mul_(2.0).to(dtype)  # sharp softmax: max matters
    v = torch.randn(bsz + 2, hkv, lmax, d, generator=g).to(dtype)
    slots = torch.randperm(bsz + 2, generator=g)[:bsz]
    return q, k, v, slots, torch.tensor(lengths, dtype=torch.int32)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), hkv=st.sampled_from([1, 2]), rows=st.sampled_from([1, 4, 17]),
       d=st.sampled_from([16, 32]), lengths=st.lists(st.integers(0, 700), min_size=1, max_size=3),
       bucket=st.sampled_from([None, 64]), launch=st.sampled_from(LAUNCHES))
@example(seed=1, hkv=2, rows=4, d=32, lengths=[0, 513, 700], bucket=None, launch=None)
@example(seed=4, hkv=1, rows=4, d=32, lengths=[700, 0], bucket=None, launch=LAUNCHES[1])  # 40 chunks
def test_matches_float64_reference(seed, hkv, rows, d, lengths, bucket, launch):
    lmax = 640
    q, k, v, slots, used = case(seed, len(lengths), hkv, rows, d, lmax, lengths)
    out, lse = cache_attention(q, k, v, slots, used, max_keys=None if bucket is None else max(lengths + [bucket]),
                               launch=launch)
    want, want_lse = cache_attention_ref(q, k, v, slots, used)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_several_chunks_are_merged():
    """Batch 1, one KV head, 600 keys: three chunks of the keys, merged."""
    assert attention_splits(1, 1, 1, 600) == 3
    q, k, v, slots, used = case(3, 1, 1, 4, 32, 640, [600])
    out, lse = cache_attention(q, k, v, slots, used)
    want, want_lse = cache_attention_ref(q, k, v, slots, used)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_many_chunks_are_merged_in_several_passes():
    """A launch of 16-key chunks cuts 600 keys into 38 chunks, more than the merge weighs at
    once (MERGE_CHUNKS), the last pass part-masked."""
    from bole_cli.kernels.cache_attention import MERGE_CHUNKS

    assert attention_splits(1, 1, 1, 600, 264, 16) == 38 > 2 * MERGE_CHUNKS
    q, k, v, slots, used = case(5, 1, 1, 4, 32, 640, [600])
    out, lse = cache_attention(q, k, v, slots, used, launch=(16, 4, 1, 264, 16, 16))
    want, want_lse = cache_attention_ref(q, k, v, slots, used)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_the_default_launch_follows_the_rows_and_their_programs():
    """Over few keys (fewer than ONE_TILE_MIN_KEYS read again, fewer than FULL_MIN_KEYS a
    request), at 4 KV heads and a GQA group of 4: a decode (4 rows), a drafter level or a
    tree of 8 tokens (32 rows) take the few-rows launch at any batch; a verify of 32 tokens
    (128 rows, 8 tiles of 16) at batch 1 too (32 programs), at batch 4 the split launch
    (128), at batch 16 the full one (512 tiles of 16 rows; it takes 64 a tile and splits the
    keys in 3)."""
    few = 32  # keys a request: 48 rows' two tiles past the first at batch 64 read 2 x 64 x 32 again
    assert all(attention_launch(b, 4, rows, few) == FEW_ROWS_LAUNCH for b in (1, 4, 16, 64) for rows in (4, 32))
    assert attention_launch(1, 4, 128, few) == FEW_ROWS_LAUNCH
    assert attention_launch(4, 4, 128, few) == MANY_ROWS_LAUNCH
    assert attention_launch(16, 4, 128, few) == FULL_LAUNCH
    assert attention_splits(16, 4, 128 // FULL_LAUNCH[5], 4096, *FULL_LAUNCH[3:5]) == 3
    # the thresholds: more than FEW_ROWS rows, more than FEW_PROGRAMS tiles, TARGET_PROGRAMS
    # tiles (8 of 16 rows a pair: under FULL_MIN_ROW_TILES)
    assert attention_launch(1, FEW_PROGRAMS // 8, 128, few) == FEW_ROWS_LAUNCH
    assert attention_launch(1, FEW_PROGRAMS // 8 + 1, 128, few) == MANY_ROWS_LAUNCH
    # exactly FEW_PROGRAMS tiles are few (S17-a: 27B's 10 tokens and 9B's 16 at batch 4, kv 1024,
    # which take one tile since S23-a; over few keys the 16-row tiles)
    assert attention_launch(4, 4, 60, few) == attention_launch(4, 4, 64, few) == FEW_ROWS_LAUNCH
    assert attention_launch(1, -(-TARGET_PROGRAMS // 8), 128, few) == FULL_LAUNCH
    assert attention_launch(1, -(-TARGET_PROGRAMS // 8) - 1, 128, few) == MANY_ROWS_LAUNCH
    assert attention_launch(64, 4, 32, few) == FEW_ROWS_LAUNCH  # 512 tiles, but few rows
    assert attention_launch(64, 4, 48, few) == MANY_ROWS_LAUNCH  # 768 tiles of 33-63 rows: FULL's tiles would idle


def test_64_rows_or_more_take_64_row_tiles_over_many_keys():
    """FULL_LAUNCH's 64-row tiles beyond the programs rule, over FULL_MIN_KEYS keys or more:
    from FULL_MIN_ROW_TILES 16-row tiles a pair (27B's 32-token tree, 192 rows) and, past 64
    rows, where the 16-row tiles make at most FEW_PROGRAMS programs (27B's 16-token tree and
    9B's 32 at batch 1); neither over fewer keys, nor for 64 rows or fewer (9B's 16-token
    tree at batch 1, kv 4096, takes the 16-row tiles: S17-a)."""
    assert FULL_MIN_ROW_TILES == 12 and FULL_MIN_KEYS == 4096
    for b in (1, 4):
        assert attention_launch(b, 4, 16 * FULL_MIN_ROW_TILES, FULL_MIN_KEYS) == FULL_LAUNCH
        assert attention_launch(b, 4, 16 * FULL_MIN_ROW_TILES, FULL_MIN_KEYS - 1) == (FEW_ROWS_LAUNCH if b == 1 else
                                                                                     MANY_ROWS_LAUNCH)
    assert attention_launch(4, 4, 16 * FULL_MIN_ROW_TILES - 16, 10**6) == MANY_ROWS_LAUNCH  # 11 tiles, 176 programs
    assert attention_launch(1, 4, 96, 1024) == FEW_ROWS_LAUNCH  # 27B's 16 tokens at batch 1, kv 1024
    assert attention_launch(1, 4, 96, FULL_MIN_KEYS) == FULL_LAUNCH  # ... kv 4096: 24 programs
    assert attention_launch(4, 4, 96, 16384) == MANY_ROWS_LAUNCH  # 96 programs: not few
    assert attention_launch(4, 4, 128, 16384) == MANY_ROWS_LAUNCH  # 9B's 32 tokens at batch 4
    assert attention_launch(4, 4, 256, 1024) == MANY_ROWS_LAUNCH  # 9B's 64 tokens at batch 4 over a 1k cache
    # few programs: at most FEW_PROGRAMS 16-row tiles (8 a pair at 128 rows), past one 64-row
    # tile (exactly 64 rows lost 1.27x at batch 1, kv 4096: 9B's 16 tokens, S17-a)
    assert attention_launch(1, FEW_PROGRAMS // 8, 128, FULL_MIN_KEYS) == FULL_LAUNCH
    assert attention_launch(1, FEW_PROGRAMS // 8 + 1, 128, FULL_MIN_KEYS) == MANY_ROWS_LAUNCH
    assert attention_launch(1, 4, 64, FULL_MIN_KEYS) == FEW_ROWS_LAUNCH
    assert attention_launch(1, 4, 65, FULL_MIN_KEYS) == FULL_LAUNCH
    assert attention_launch(1, 1, 63, 10**6) == ONE_TILE_ROWS_LAUNCHES[-1][1]  # under 64 rows: one tile
    assert attention_launch(1, 1, 63, 100) == FEW_ROWS_LAUNCH  # ... over few keys the 16-row tiles


def test_many_keys_take_one_tile_for_17_to_64_rows():
    """Where 16-row tiles would read one_tile_min_keys keys again over the batch ((tiles - 1)
    x batch x keys a request), 17-32 rows (a tree of 8 tokens at a group of 4, of 4 at 27B's
    6: two tiles) and 33-64 (8 tokens at 6: three tiles; 49-64: four) each take the launch
    whose one tile holds them all: from ONE_TILE_MIN_KEYS, half for a tree of two tiles, a
    quarter for three or four tiles from ONE_TILE_MIN_BATCH requests (a tree's too); 16 rows
    or fewer, more than 64, or fewer keys: the rule as before."""
    (most32, rows32), (most64, rows64) = ONE_TILE_ROWS_LAUNCHES
    assert (most32, rows32[5], most64, rows64[5]) == (32, 32, 64, 64)
    assert ONE_TILE_MIN_BATCH == 4
    for tree, share in ((False, 1), (True, 2)):
        many = ONE_TILE_MIN_KEYS // share // 16
        for rows in (17, 24, 32):
            assert attention_launch(16, 4, rows, many, tree) == rows32
            assert attention_launch(16, 4, rows, many - 1, tree) == FEW_ROWS_LAUNCH
            assert attention_launch(1, 4, rows, ONE_TILE_MIN_KEYS // share, tree) == rows32
            assert attention_launch(1, 4, rows, ONE_TILE_MIN_KEYS // share - 1, tree) == FEW_ROWS_LAUNCH
        for rows, row_tiles in ((33, 3), (48, 3), (49, 4), (64, 4)):
            for batch in (ONE_TILE_MIN_BATCH, 16):  # a quarter, tree or not
                enough = -(-ONE_TILE_MIN_KEYS // 4 // (batch * (row_tiles - 1)))
                assert attention_launch(batch, 4, rows, enough, tree) == rows64
                assert attention_launch(batch, 4, rows, enough - 1, tree) != rows64
            # under ONE_TILE_MIN_BATCH requests the whole threshold, a tree's too (64 rows at
            # batch 1: one 64-row tile, S17-a)
            batch = ONE_TILE_MIN_BATCH - 1
            enough = -(-ONE_TILE_MIN_KEYS // (batch * (row_tiles - 1)))
            assert attention_launch(batch, 4, rows, enough, tree) == rows64
            assert attention_launch(batch, 4, rows, enough - 1, tree) != rows64
            below = -(-ONE_TILE_MIN_KEYS // (row_tiles - 1)) - 1
            assert attention_launch(1, 4, rows, below, tree) == FEW_ROWS_LAUNCH
    assert attention_launch(16, 4, 48, 170) == MANY_ROWS_LAUNCH  # 2 x 16 x 170 keys again: under a quarter
    assert attention_launch(1, 4, 48, ONE_TILE_MIN_KEYS // 2) == rows64  # batch 1 over as many keys
    assert attention_launch(4, 4, 48, 1034) == rows64  # 27B's 8-token level at batch 4, kv 1024 (S23-a)
    assert attention_launch(1, 4, 48, 4104) == FEW_ROWS_LAUNCH  # ... at batch 1, kv 4096: no (S23-a)
    assert attention_launch(1, 4, 48, 12000, tree=True) == FEW_ROWS_LAUNCH  # its tree: no half past 2 tiles
    assert attention_launch(4, 4, 32, 4104) == FEW_ROWS_LAUNCH  # 9B's 8-token level: two tiles, under
    assert attention_launch(4, 4, 32, 4104, tree=True) == rows32  # ... its tree: half (S23-a)
    assert attention_launch(16, 4, 16, 10**6) == FEW_ROWS_LAUNCH
    assert attention_launch(4, 4, 65, 10**6) == MANY_ROWS_LAUNCH  # 65 rows: past one tile's 64
    assert attention_launch(16, 4, 128, 10**6) == FULL_LAUNCH
    assert attention_launch(4, 4, 128, 10**6) == MANY_ROWS_LAUNCH


def test_the_launch_rule_names_its_constants():
    """A profile's provenance names the rule (runtime.timer): the name follows the constants."""
    import bole_cli.kernels.cache_attention as kernel

    assert kernel.LAUNCH_RULE == (f"rows and programs (S9-f); one tile for 17-{ONE_TILE_ROWS_LAUNCHES[-1][0]} "
                                  f"rows from {ONE_TILE_MIN_KEYS} keys read again, half for a two-tile tree, a "
                                  f"quarter past 32 rows at {ONE_TILE_MIN_BATCH} requests or more (S15-b, S16-a, "
                                  f"S23-a); 64-row tiles from "
                                  f"{FULL_MIN_ROW_TILES} tiles of 16 or few programs past 64 rows, over "
                                  f"{FULL_MIN_KEYS} keys (S16-b, S17-a); at most {FEW_PROGRAMS} tiles few (S17-a)")


def test_the_one_tile_launch_is_the_default_over_many_keys(monkeypatch):
    """The default launch itself (no launch given) follows the rule on the max_keys it is
    given, not the cache's length, and knows a tree from its tree_bias: 27B's 4-token tree
    (24 rows) over a 640-key cache with ONE_TILE_MIN_KEYS lowered to 4 x 600 keys (a tree's
    threshold: 2 x 600) takes one tile at max_keys 600 and the 16-row tiles at 599, each
    against the float64 reference (the one tile bit for bit its explicit launch)."""
    import bole_cli.kernels.cache_attention as kernel

    g = torch.Generator().manual_seed(11)
    q, k, v, slots, used = case(12, 2, 2, 24, 16, 640, [590, 70])
    bias = tree_mask(g, 2, 1, 4, 6, 4)
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias)
    monkeypatch.setattr(kernel, "ONE_TILE_MIN_KEYS", 4 * 600)  # a tree's: half
    chosen = []
    rule = kernel.attention_launch
    monkeypatch.setattr(kernel, "attention_launch", lambda *a: chosen.append(rule(*a)) or chosen[-1])
    outs = {}
    for max_keys, launch in ((600, ONE_TILE_ROWS_LAUNCHES[0][1]), (599, FEW_ROWS_LAUNCH)):
        out, lse = cache_attention(q, k, v, slots, used, max_keys=max_keys, tree_bias=bias)
        assert chosen[-1] == launch
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)
        outs[max_keys] = out, lse
    one, one_lse = cache_attention(q, k, v, slots, used, max_keys=600, tree_bias=bias,
                                   launch=ONE_TILE_ROWS_LAUNCHES[0][1])
    assert torch.equal(outs[600][0], one) and torch.equal(outs[600][1], one_lse)


@pytest.mark.parametrize("nodes, group", [(9, 4), (17, 4), (4, 6), (7, 6)])
def test_the_default_launches_compute_the_same_attention(nodes, group):
    """Each of the rule's launches (rows a tile 16, 32 or 64, several key chunks) against the
    float64 reference: a tree of `nodes` tokens at a GQA group of 4 (36 rows: one part-masked
    tile of 64; 68: a second tile of 4) or 27B's 6 (24 rows, 42)."""
    g = torch.Generator().manual_seed(8)
    q, k, v, slots, used = case(8, 2, 2, nodes * group, 16, 640, [600, 70])
    bias = tree_mask(g, 2, 1, nodes, group, nodes)
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias)
    for launch in (FEW_ROWS_LAUNCH, MANY_ROWS_LAUNCH, FULL_LAUNCH, *(one for _, one in ONE_TILE_ROWS_LAUNCHES)):
        out, lse = cache_attention(q, k, v, slots, used, tree_bias=bias, launch=launch)
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_a_launch_past_the_grid_is_refused():
    """One key a chunk over a cache of 66,000 keys: more chunks than CUDA's 65,535 programs on
    that axis, refused by name before any launch."""
    q, k, v, slots, used = case(9, 1, 1, 4, 16, 66_000, [66_000])
    with pytest.raises(InputError, match="65535"):
        cache_attention(q, k, v, slots, used, launch=(16, 4, 1, 10**6, 1, 16))


@pytest.mark.parametrize("launch", [(48, 4, 1, 264, 16, 16), (64, 32, 3, 264, 256, 16), (64, 4, 0, 264, 256, 16),
                                    (64, 4, 3, 0, 256, 16), (64, 4, 3, 264, 256), [64, 4, 3, 264, 256, 16],
                                    (64, 4, 3, 264, 256.0, 16), (8, 4, 3, 264, 256, 16), (64, 4, 3, 264, 256, 8),
                                    (64, 4, 3, 264, 256, 24), (256, 4, 3, 264, 256, 16), (64, 4, 3, 264, 256, 256)])
def test_bad_launches_are_refused(launch):
    q, k, v, slots, used = case(6, 1, 1, 4, 16, 64, [60])
    with pytest.raises(InputError, match="launch"):
        cache_attention(q, k, v, slots, used, launch=launch)


def tree_mask(g, bsz, heads, nodes, group, width, dtype=torch.float32):
    """An additive tree mask [B, heads, nodes x group, width]: each node sees its random
    ancestors and itself (parents before children), padding columns -inf."""
    bias = torch.full((bsz, heads, nodes * group, width), float("-inf"))
    for b in range(bsz):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, nodes)]
        for i in range(nodes):
            j = i
            while j >= 0:
                bias[b, :, i * group: (i + 1) * group, j] = 0.0
                j = parents[j]
    return bias.to(dtype)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 4]),
       nodes=st.integers(1, 9), pad=st.sampled_from([0, 3]), heads=st.sampled_from([1, "H"]),
       lengths=st.lists(st.integers(0, 700), min_size=1, max_size=3))
@example(seed=2, hkv=1, group=2, nodes=5, pad=0, heads=1, lengths=[636, 0, 300])  # past the end; no cache
def test_tree_keys_after_the_cache_match_float64_reference(seed, hkv, group, nodes, pad, heads, lengths):
    lmax, d = 640, 16
    g = torch.Generator().manual_seed(seed)
    q, k, v, slots, used = case(seed, len(lengths), hkv, nodes * group, d, lmax, lengths)
    bias = tree_mask(g, len(lengths), hkv if heads == "H" else 1, nodes, group, nodes + pad)
    out, lse = cache_attention(q, k, v, slots, used, tree_bias=bias)
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_tree_attention_is_the_runtimes_split_tree_attention():
    """The cache part and the tree part in one kernel (several key chunks, the tree's keys in
    the last) against runtime.attention.split_tree_attention over the same keys, a row that
    sees only the cache (padding) included."""
    from bole_cli.runtime.attention import split_tree_attention

    g = torch.Generator().manual_seed(7)
    bsz, hkv, group, nodes, base, d = 2, 2, 2, 6, 520, 16
    q, k, v, slots, _ = case(7, bsz, hkv, nodes * group, d, 640, [base] * bsz)
    used = torch.full((bsz,), base, dtype=torch.int64)
    bias = tree_mask(g, bsz, 1, nodes, group, nodes)
    bias[1, :, -group:] = float("-inf")  # request 1's last node: a padding row, the cache only
    out, lse = cache_attention(q, k, v, slots, used, tree_bias=bias)
    kc, vc = k[slots][:, :, :base], v[slots][:, :, :base]
    kt, vt = k[slots][:, :, base: base + nodes], v[slots][:, :, base: base + nodes]
    want = split_tree_attention(q, kc, vc, kt, vt, bias)
    torch.testing.assert_close(out[0], want[0], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out[1, :, :-group], want[1, :, :-group], atol=2e-5, rtol=2e-5)
    # the padding row: the cache alone (split_tree_attention gives NaN there, a row it drops)
    alone = cache_attention(q, k, v, slots, used)[0]
    torch.testing.assert_close(out[1, :, -group:], alone[1, :, -group:], atol=2e-5, rtol=2e-5)
    assert attention_splits(bsz, hkv, 1, base + nodes) > 1


@pytest.mark.parametrize("tokens,group,keys", [(5, 4, 100), (3, 2, 600)])  # one chunk; merged
def test_token_major_queries_give_token_major_outputs(tokens, group, keys):
    """q as a verify has it, [B, T, H_kv, G, D] transposed to [B, H_kv, T, G, D] (no copy):
    the same as its rows copied to [B, H_kv, T G, D], out back token-major (a view of a
    contiguous [B, T, H_kv, G, D]), with and without a tree."""
    g = torch.Generator().manual_seed(10)
    bsz, hkv, d = 2, 2, 16
    q, k, v, slots, used = case(10, bsz, hkv, tokens * group, d, 640, [keys, keys // 2])
    q5 = torch.randn(bsz, tokens, hkv, group, d, generator=g).transpose(1, 2)
    rows = q5.reshape(bsz, hkv, tokens * group, d)
    for bias in (None, tree_mask(g, bsz, 1, tokens, group, tokens)):
        out, lse = cache_attention(q5, k, v, slots, used, tree_bias=bias)
        want, want_lse = cache_attention(rows, k, v, slots, used, tree_bias=bias)
        assert out.shape == q5.shape and out.transpose(1, 2).is_contiguous()
        torch.testing.assert_close(out.reshape(want.shape), want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-6)


def test_a_smaller_tree_reads_only_its_own_keys():
    """A forest of a 2-node and a 4-node tree (T 4): with tree_cu the first request never
    reads its padded columns' positions, which hold NaN and inf here (nothing wrote them this
    step), so its rows stay exact; its padding rows see the cache alone."""
    g = torch.Generator().manual_seed(11)
    q, k, v, slots, _ = case(11, 2, 1, 4, 16, 64, [10, 10])
    used = torch.tensor([10, 20])
    bias = tree_mask(g, 2, 1, 4, 1, 4)
    bias[0, :, 2:] = float("-inf")  # request 0 has 2 nodes: rows 2-3 padding, columns 2-3 unused
    k[slots[0], :, 12], v[slots[0], :, 13] = float("nan"), float("inf")
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    out, lse = cache_attention(q, k, v, slots, used, tree_bias=bias, tree_cu=cu)
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias, tree_cu=cu)
    assert torch.isfinite(out).all() and torch.isfinite(want).all()
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_tree_rows_that_see_nothing_get_zero():
    """No committed keys and a row masked off every tree key: out 0, lse -inf (no NaN from
    the masked chunk), the other rows as the reference."""
    q, k, v, slots, _ = case(8, 1, 1, 3, 16, 64, [0])
    bias = torch.tensor([[[[0.0, float("-inf")], [float("-inf"), float("-inf")], [0.0, 0.0]]]])
    out, lse = cache_attention(q, k, v, slots, torch.zeros(1, dtype=torch.int64), tree_bias=bias)
    assert (out[0, 0, 1] == 0).all() and lse[0, 0, 1] == float("-inf")
    want, want_lse = cache_attention_ref(q, k, v, slots, torch.zeros(1, dtype=torch.int64), tree_bias=bias)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)


def test_a_chunk_of_tree_keys_a_row_cannot_see_merges_as_nothing():
    """Key chunks of 192 (max_keys 520: three): the last holds only the tree's keys, and one
    row sees none of them; its other chunks still count, with no NaN from the empty one."""
    q, k, v, slots, _ = case(9, 1, 1, 4, 16, 640, [384])
    used = torch.tensor([384])
    bias = torch.zeros(1, 1, 4, 4)
    bias[0, 0, 2] = float("-inf")
    out, lse = cache_attention(q, k, v, slots, used, tree_bias=bias, max_keys=520)
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias)
    assert attention_splits(1, 1, 1, 520) == 3
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("keys", [100, 600])  # one chunk (normalised in place) or merged
def test_slot_outside_the_pool_is_nan(keys):
    q, k, v, slots, used = case(4, 2, 1, 4, 16, 640, [keys, keys])
    slots[1] = 99
    out, lse = cache_attention(q, k, v, slots, used)
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("change, message", [
    (dict(k=torch.zeros(3, 2, 8, 16)), "k_cache"),
    (dict(slots=torch.zeros(3, dtype=torch.int64)), "slots"),
    (dict(used=torch.zeros(2)), "used"),
    (dict(tree_bias=torch.zeros(2, 1, 3, 5)), "tree_bias"),
    (dict(tree_bias=torch.zeros(2, 3, 4, 5)), "tree_bias"),
    (dict(tree_bias=torch.zeros(2, 1, 5, 4).transpose(2, 3)), "tree_bias"),
    (dict(tree_cu=torch.zeros(3, dtype=torch.int32)), "tree_cu"),
    (dict(tree_bias=torch.zeros(2, 1, 4, 5), tree_cu=torch.zeros(2, dtype=torch.int32)), "tree_cu"),
])
def test_bad_input_names_the_argument(change, message):
    q, k, v, slots, used = case(0, 2, 1, 4, 16, 64, [3, 4])
    args = dict(q=q, k=k, v=v, slots=slots, used=used, tree_bias=None, tree_cu=None) | change
    with pytest.raises(InputError, match=message):
        cache_attention(args["q"], args["k"], args["v"], args["slots"], args["used"], tree_bias=args["tree_bias"],
                        tree_cu=args["tree_cu"])


@pytest.mark.gpu
@pytest.mark.parametrize("bsz, keys", [(1, 4096), (16, 1024), (4, 16384)])
def test_bf16_on_gpu(bsz, keys):
    q, k, v, slots, used = case(5, bsz, 4, 4, 256, keys, [keys - b for b in range(bsz)], dtype=torch.bfloat16)
    q, k, v, slots, used = (t.cuda() for t in (q, k, v, slots, used))
    out, lse = cache_attention(q, k, v, slots, used)
    want, want_lse = cache_attention_ref(q.cpu(), k.cpu(), v.cpu(), slots.cpu(), used.cpu())
    assert float((out.cpu().double() - want).norm() / want.norm()) < 1e-2
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("bsz, keys, nodes, group", [(1, 4096, 32, 4), (16, 1024, 16, 4), (16, 1024, 17, 4),
                                                     (16, 4096, 8, 4), (4, 16384, 4, 6), (16, 4096, 8, 6)])
def test_bf16_tree_on_gpu(bsz, keys, nodes, group):
    """A 9B verify's attention (4 KV heads, groups of 4, head 256) or 27B's (groups of 6): the
    committed keys and the tree's after them under its mask, against float64. The rule's
    launches: few rows at batch 1, many at 16 x 16 tokens, full tiles (64 rows, the second of
    4) at 16 x 17; over many keys one tile of 32 rows (9B's 8 tokens, 27B's 4) or 64 (27B's 8)."""
    g = torch.Generator().manual_seed(6)
    q, k, v, slots, used = case(6, bsz, 4, nodes * group, 256, keys + nodes, [keys - b for b in range(bsz)],
                                dtype=torch.bfloat16)
    bias = tree_mask(g, bsz, 1, nodes, group, nodes)
    out, lse = cache_attention(*(t.cuda() for t in (q, k, v, slots, used)), tree_bias=bias.cuda())
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias)
    assert float((out.cpu().double() - want).norm() / want.norm()) < 1e-2
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("seed, lengths, launch, tree", [
    (1, [100, 37, 0], None, False),  # one chunk, normalised in place; a request with no key
    (2, [600, 300], (16, 4, 1, 264, 16, 16), False),  # 38 chunks merged
    (3, [513, 60], None, True),  # a tree's keys after the cache, under its mask
    (4, [600, 300], ONE_TILE_ROWS_LAUNCHES[0][1], True),  # the tree's 20 rows in one 32-row tile
])
def test_bf16_matches_float64_reference_near_the_rounding_floor(gpu_like_bf16_dots, seed, lengths,
                                                                launch, tree):
    """bfloat16 q, k, v (the serving dtype) against float64 on the same rounded inputs: out
    within a few times what rounding the exact output to bf16 costs (the kernel rounds the
    softmax weights to bf16 for the P V dot, as on the GPU, and the interpreter casts to bf16
    toward zero where the GPU rounds to nearest: about 2-3x that floor), lse
    (float32 throughout) near float32's. Scores, softmax and sums stay float32."""
    g = torch.Generator().manual_seed(seed)
    nodes, group = (5, 4) if tree else (1, 4)
    q, k, v, slots, used = case(seed, len(lengths), 2, nodes * group, 32, 640, lengths,
                                dtype=torch.bfloat16)
    bias = tree_mask(g, len(lengths), 1, nodes, group, nodes) if tree else None
    out, lse = cache_attention(q, k, v, slots, used, tree_bias=bias, launch=launch)
    want, want_lse = cache_attention_ref(q, k, v, slots, used, tree_bias=bias)
    assert out.dtype == torch.bfloat16
    floor = float((want.to(torch.bfloat16).double() - want).norm() / want.norm())
    err = float((out.double() - want).norm() / want.norm())
    assert err < 4 * floor, (err, floor)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
