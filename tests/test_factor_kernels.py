"""The SGLang plug-in's two copy kernels against their exact references (docs/design.md §6).

`conv_window_commit` (every layer's conv window after a verify) and `seed_slots` (the
track slots' copy of the request's state) move values without arithmetic, so the kernels
must equal `reference.conv_window_commit_ref` / `reference.seed_slots_ref` bit for bit.
Random forests with the cases that bite: root paths shorter than the window, several
roots in one request, parents that do not point to an earlier node, padding slots -1,
accepted -1, steps -1; the conv pool in both of SGLang's storage layouts. Runs under
Triton's CPU interpreter without CUDA.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bole_cli.errors import BoleError
from bole_cli.kernels.conv_window_commit import conv_window_commit
from bole_cli.kernels.reference import conv_window_commit_ref, seed_slots_ref
from bole_cli.kernels.seed_slots import seed_slots

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _parents(r: random.Random, n: int, shape: str) -> list[int]:
    """Local parents of one request: a tree, a forest (several roots) or a broken one."""
    if shape == "chain":
        return list(range(-1, n - 1))
    out = []
    for i in range(n):
        if shape == "forest" and r.random() < 0.4:
            out.append(-1)
        elif shape == "broken" and r.random() < 0.3:
            out.append(r.randint(i, n))  # itself or a later node: the walk stops there
        else:
            out.append(r.randint(-1, i - 1))
    return out


def _distinct(r: random.Random, pool: int, count: int, padding: float) -> list[int]:
    chosen = r.sample(range(pool), count)
    return [-1 if r.random() < padding else s for s in chosen]


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**31 - 1),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    window=st.integers(1, 5),
    layers=st.integers(1, 3),
    dim=st.sampled_from([1, 5, 130]),
    shape=st.sampled_from(["tree", "chain", "forest", "broken"]),
    dtype=st.sampled_from(sorted(DTYPES)),
    transposed=st.booleans(),
)
@example(seed=1, sizes=[1, 2], window=4, layers=2, dim=5, shape="forest", dtype="float32",
         transposed=False)  # every path shorter than the window: prev fills the rest
def test_conv_window_commit_matches_reference(seed, sizes, window, layers, dim, shape, dtype,
                                              transposed):
    r = random.Random(seed)
    torch.manual_seed(seed)
    dt = DTYPES[dtype]
    n_req, slots = len(sizes), len(sizes) + 3
    parents = torch.tensor([p for n in sizes for p in _parents(r, n, shape)], dtype=torch.int32)
    cu = torch.tensor([0] + [sum(sizes[: i + 1]) for i in range(n_req)], dtype=torch.int32)
    tokens = int(cu[-1]) + r.randint(0, 3)  # the packed batch may carry padding rows
    accepted = torch.tensor([r.randint(-1, n - 1) for n in sizes], dtype=torch.int32)
    dst = torch.tensor(_distinct(r, slots, n_req, 0.2), dtype=torch.int32)
    x = torch.randn(layers, tokens, dim).to(dt)
    prev = torch.randn(layers, n_req + r.randint(0, 2), dim, window).to(dt)
    if transposed:  # SGLang's [S, W-1, D] storage, addressed as [S, D, W-1]
        conv = torch.randn(layers, slots, window, dim).to(dt).transpose(-1, -2)
    else:
        conv = torch.randn(layers, slots, dim, window).to(dt)
    want = conv_window_commit_ref(conv, x, prev, dst, parents, cu, accepted)
    conv_window_commit(conv, x, prev, dst, parents, cu, accepted)
    assert torch.equal(conv, want)


def test_conv_window_commit_reference_by_hand():
    """One request, the chain 0 <- 1 <- 2, accepted node 1, window 3: the two path inputs
    are the newest columns, the oldest is the newest column of the pre-verify window."""
    x = torch.tensor([[[10.0], [11.0], [12.0]]])  # [L=1, T=3, D=1]
    prev = torch.tensor([[[[1.0, 2.0, 3.0]]]])  # [L=1, B=1, D=1, W-1=3]
    conv = torch.zeros(1, 2, 1, 3)
    args = (torch.tensor([1], dtype=torch.int32), torch.tensor([-1, 0, 1], dtype=torch.int32),
            torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1], dtype=torch.int32))
    want = conv_window_commit_ref(conv, x, prev, *args)
    assert want[0, 1, 0].tolist() == [3.0, 10.0, 11.0] and not want[0, 0].any()
    conv_window_commit(conv, x, prev, *args)
    assert torch.equal(conv, want)


def test_conv_window_commit_needs_channel_contiguous_inputs():
    x = torch.randn(1, 4, 3).transpose(1, 2).contiguous().transpose(1, 2)  # [1, 4, 3], stride(-1) 4
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(BoleError, match="channel-contiguous"):
        conv_window_commit(torch.zeros(1, 1, 3, 2), x, torch.zeros(1, 1, 3, 2), one,
                           torch.full((4,), -1, dtype=torch.int32),
                           torch.tensor([0, 4], dtype=torch.int32), one)


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_req=st.integers(1, 4),
    layers=st.integers(1, 3),
    entry=st.sampled_from([(1,), (3, 2), (2, 3, 700)]),
    dtype=st.sampled_from(sorted(DTYPES)),
)
def test_seed_slots_matches_reference(seed, n_req, layers, entry, dtype):
    r = random.Random(seed)
    torch.manual_seed(seed)
    slots = 2 * n_req + 2
    picked = r.sample(range(slots), 2 * n_req)  # sources and destinations never overlap
    src = torch.tensor([-1 if r.random() < 0.15 else s for s in picked[:n_req]], dtype=torch.int32)
    dst = torch.tensor([-1 if r.random() < 0.15 else s for s in picked[n_req:]], dtype=torch.int32)
    steps = torch.tensor([r.randint(-1, 3) for _ in range(n_req)], dtype=torch.int32)
    state = torch.randn(layers, slots, *entry).to(DTYPES[dtype])
    want = seed_slots_ref(state, src, dst, steps)
    seed_slots(state, src, dst, steps)
    assert torch.equal(state, want)


def test_seed_slots_reference_by_hand():
    state = torch.arange(8.0).reshape(1, 4, 2)
    src = torch.tensor([0, 1, 2], dtype=torch.int32)
    dst = torch.tensor([3, -1, 1], dtype=torch.int32)
    steps = torch.tensor([0, 2, -1], dtype=torch.int32)  # only request 0 is copied
    want = seed_slots_ref(state, src, dst, steps)
    assert want[0].tolist() == [[0, 1], [2, 3], [4, 5], [0, 1]]
    seed_slots(state, src, dst, steps)
    assert torch.equal(state, want)


def test_seed_slots_needs_contiguous_slots():
    state = torch.zeros(1, 3, 4, 2).transpose(2, 3)  # each slot entry strided
    idx = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(BoleError, match="contiguous"):
        seed_slots(state, idx, idx, idx)


def test_slots_outside_the_pool_and_nodes_outside_the_tree_touch_nothing():
    """Without a host check, a slot at or past S (or an accepted node past its request, or
    offsets past the tokens) is skipped: the pools are views inside bigger tensors and the
    slots past their end stay as they were; the references skip the same requests."""
    torch.manual_seed(3)
    big = torch.randn(2, 6, 3, 4)
    state = big[:, :4]  # S = 4; slots 4 and 5 lie outside the argument
    before = big.clone()
    src = torch.tensor([4, 0, 1, 0], dtype=torch.int32)
    dst = torch.tensor([1, 5, 2, 3], dtype=torch.int32)  # only request 2 (1 -> 2) and 3 (0 -> 3) copy
    steps = torch.zeros(4, dtype=torch.int32)
    want = seed_slots_ref(state, src, dst, steps)
    seed_slots(state, src, dst, steps)
    assert torch.equal(state, want) and torch.equal(big[:, 4:], before[:, 4:])
    assert torch.equal(want[:, :2], before[:, :2])

    conv_big = torch.randn(2, 5, 3, 2)
    conv = conv_big[:, :3]  # S = 3
    before = conv_big.clone()
    x = torch.randn(2, 6, 3)
    prev = torch.randn(2, 4, 3, 2)
    parents = torch.tensor([-1, 0, 1, -1, 0, 1], dtype=torch.int32)
    cu = torch.tensor([0, 3, 6, 6, 9], dtype=torch.int32)  # the last request's offsets past T = 6
    dst = torch.tensor([3, 0, 1, 2], dtype=torch.int32)  # slot 3 outside the pool
    accepted = torch.tensor([2, 3, 0, 1], dtype=torch.int32)  # node 3 outside request 1's three
    want = conv_window_commit_ref(conv, x, prev, dst, parents, cu.clamp(max=6), accepted)
    conv_window_commit(conv, x, prev, dst, parents, cu, accepted)
    assert torch.equal(conv, want) and torch.equal(conv_big[:, 3:], before[:, 3:])
    assert torch.equal(conv[:, :2], before[:, :2])  # requests 0 and 1 commit nothing
    assert torch.equal(conv[:, 2], before[:, 2])  # the empty-after-clamping request neither


def test_factor_kernels_read_strided_index_vectors():
    """The index vectors are read as raw memory: a strided view is copied first."""
    torch.manual_seed(5)
    state = torch.randn(1, 4, 2)
    every_other = lambda t: torch.stack([t, torch.full_like(t, 99)], -1)[..., 0]  # noqa: E731
    src, dst, steps = (every_other(torch.tensor(v, dtype=torch.int32)) for v in ([0, 1], [2, 3], [0, 0]))
    want = seed_slots_ref(state, src, dst, steps)
    seed_slots(state, src, dst, steps)
    assert torch.equal(state, want)
    conv, x, prev = torch.randn(1, 2, 3, 2), torch.randn(1, 4, 3), torch.randn(1, 2, 3, 2)
    parents, cu = every_other(torch.tensor([-1, 0, -1, 0], dtype=torch.int32)), every_other(
        torch.tensor([0, 2, 4], dtype=torch.int32))
    dst, accepted = every_other(torch.tensor([1, 0], dtype=torch.int32)), every_other(
        torch.tensor([1, 0], dtype=torch.int32))
    want = conv_window_commit_ref(conv, x, prev, dst, parents, cu, accepted)
    conv_window_commit(conv, x, prev, dst, parents, cu, accepted)
    assert torch.equal(conv, want)
