"""kernels.kv_compact against its exact reference (kernels/reference.py) and against the
runtime's tensor-op move it replaces on the GPU: random forests (several roots, deep
chains), every accepted node, requests that accept nothing, slots and positions outside the
cache (nothing moved, nothing written outside), and its refusals. CPU: the interpreter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels.kv_compact import kv_compact
from bole_cli.kernels.reference_attention import kv_compact_ref

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def forest(gen, sizes):
    """cu_seqlens and path_table [N, depth] of random trees (several roots allowed)."""
    rows, depth_max = [], 1
    for n in sizes:
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, n)]
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = parents[j]
            rows.append(path[::-1])
            depth_max = max(depth_max, len(path))
    table = torch.full((len(rows), depth_max), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r)
    cu = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32)
    return cu, table


@SETTINGS
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=3), layers=st.integers(1, 3),
       heads=st.sampled_from([1, 2]), d=st.sampled_from([4, 24]), seed=st.integers(0, 2 ** 16))
def test_matches_the_reference_and_the_runtime_move(sizes, layers, heads, d, seed):
    from bole_cli.runtime.model import HybridModel

    gen = torch.Generator().manual_seed(seed)
    bsz, max_len = len(sizes), 40
    cu, table = forest(gen, sizes)
    k = torch.randn(layers, bsz + 1, heads, max_len, d, generator=gen)
    v = torch.randn(layers, bsz + 1, heads, max_len, d, generator=gen)
    slots = torch.randperm(bsz + 1, generator=gen)[:bsz]
    base = torch.randint(0, max_len - 12, (bsz,), generator=gen)
    accepted = torch.tensor([int(torch.randint(-1, n, (1,), generator=gen)) for n in sizes])
    want_k, want_v = k.clone(), v.clone()
    k0, v0 = k.clone(), v.clone()
    kv_compact_ref(want_k, want_v, slots, base, accepted, cu, table)
    kv_compact(k, v, slots, base, accepted, cu, table)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    # the runtime's tensor ops (its CPU path) on the same inputs: the same caches
    cache = SimpleNamespace(k_cache=k0, v_cache=v0, max_len=max_len)
    tb = SimpleNamespace(slots=slots, base=base, cu_seqlens=cu, path_table=table, n_nodes=table.shape[0])
    HybridModel._compact_kv(cache, tb, accepted)
    assert torch.equal(k0, want_k) and torch.equal(v0, want_v)


def test_nothing_moves_outside_the_cache_or_for_bad_rows():
    """Slots outside the pool, accepted -1 or past the forest, a base that puts the path past
    the cache's end, rows of -1: those requests move nothing; guards around both caches stay."""
    gen = torch.Generator().manual_seed(1)
    cu, table = forest(gen, [6, 6, 6, 6])
    boxes = [torch.full((2 * 3 * 1 * 16 * 8 + 2048,), 7.0) for _ in range(2)]
    k, v = (b[1024:-1024].view(2, 3, 1, 16, 8) for b in boxes)
    k.copy_(torch.randn(k.shape, generator=gen)), v.copy_(torch.randn(v.shape, generator=gen))
    slots = torch.tensor([0, 9, 1, 2])
    base = torch.tensor([2, 2, 13, 0])
    accepted = torch.tensor([5, 5, 5, 99])
    want_k, want_v = k.clone(), v.clone()
    kv_compact_ref(want_k, want_v, slots, base, accepted, cu, table)
    kv_compact(k, v, slots, base, accepted, cu, table)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    for b in boxes:
        assert (b[:1024] == 7).all() and (b[-1024:] == 7).all()


@pytest.mark.parametrize("change,field", [
    (dict(v=torch.zeros(2, 3, 1, 16, 4)), "v_cache"),
    (dict(slots=torch.zeros(2, 1, dtype=torch.int64)), "slots"),
    (dict(base=torch.zeros(3, dtype=torch.int64)), "base"),
    (dict(accepted=torch.zeros(2)), "accepted"),
    (dict(cu=torch.zeros(2, dtype=torch.int32)), "cu_seqlens"),
    (dict(table=torch.zeros(4, 3)), "path_table"),
])
def test_bad_inputs_are_named(change, field):
    kw = dict(k=torch.zeros(2, 3, 1, 16, 8), v=torch.zeros(2, 3, 1, 16, 8), slots=torch.zeros(2, dtype=torch.int64),
              base=torch.zeros(2, dtype=torch.int64), accepted=torch.zeros(2, dtype=torch.int64),
              cu=torch.tensor([0, 2, 4], dtype=torch.int32), table=torch.zeros(4, 3, dtype=torch.int64))
    kw.update(change)
    with pytest.raises(InputError, match=field):
        kv_compact(kw["k"], kw["v"], kw["slots"], kw["base"], kw["accepted"], kw["cu"], kw["table"])


@pytest.mark.gpu
def test_bf16_on_gpu_equals_the_reference():
    """bf16 caches of a 9B-like shape (8 layers, 4 KV heads, head 256) on the GPU: bitwise
    the reference's moves."""
    gen = torch.Generator().manual_seed(3)
    sizes = [16, 32, 8, 1]
    cu, table = forest(gen, sizes)
    k = torch.randn(8, 5, 4, 128, 256, generator=gen).to(torch.bfloat16)
    v = torch.randn(8, 5, 4, 128, 256, generator=gen).to(torch.bfloat16)
    slots, base = torch.tensor([4, 0, 2, 1]), torch.tensor([10, 90, 0, 50])
    accepted = torch.tensor([15, 31, -1, 0])
    want_k, want_v = k.clone(), v.clone()
    kv_compact_ref(want_k, want_v, slots, base, accepted, cu, table)
    gk, gv = k.cuda(), v.cuda()
    kv_compact(gk, gv, slots.cuda(), base.cuda(), accepted.cuda(), cu.cuda(), table.cuda())
    assert torch.equal(gk.cpu(), want_k) and torch.equal(gv.cpu(), want_v)
