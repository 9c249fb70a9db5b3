"""The deferred commit (docs/design.md §2, "Deferred commit"): verify over pending rows +
tree_commit_deferred, step after step, against the float64 truth of committing every step.

Each step draws a new forest over the same slots; the truth verifies it against the state
committed so far (tree_verify_ref + tree_commit_ref), the kernels against the written state
plus the pending rows. Small row budgets make both the append and the write path run.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels import PendingPath, new_pending, tree_commit_deferred, tree_flush, tree_verify
from bole_cli.kernels.reference import (pending_state_ref, tree_commit_deferred_ref, tree_commit_ref,
                                        tree_verify_ref)
from test_kernels import LARGE_TREE_TOL, make_case, poisoned_out, rel_err

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
KEYS = ("q", "k", "v", "g", "beta")
CALLS = {"auto": {}, "tile": {"check_trees": False, "max_nodes": 64}, "big": {"check_trees": False},
         "blocked": {"check_trees": False, "config": {"CHAIN": 0}},
         # the one-tile kernel's other pending form (the rule takes it from batch 16 at 9B)
         "tile-after": {"check_trees": False, "max_nodes": 64, "config": {"PENDING_AFTER": 1}},
         "levels": {"check_trees": False, "max_depth": 15, "config": {"LEVELS": 1}}}


def step_inputs(seed, sizes, shape, group, decay, dtype=torch.float32, h=2, kdim=16, vdim=16):
    case, forest = make_case(seed, sizes, h=h, group=group, kdim=kdim, vdim=vdim, decay=decay, dtype=dtype,
                             shape=shape, slots_extra=0)
    return {x: case[x] for x in KEYS + ("parents", "cu_seqlens")}, forest


def run_steps(steps, rows, group=2, decay=(-2.0, -0.01), kernel="auto", state_dtype=torch.float32,
              dtype=torch.float32, seed=0, tol=2e-5, h=2, kdim=16, vdim=16):
    """steps: [(sizes, shape[, accepted])], one forest each over len(sizes) slots of a pool
    with spares (accepted nodes drawn at random unless given).
    Checks every step's verify and the true state after every commit; returns the counts
    seen after each commit (which path the commits took)."""
    bsz = len(steps[0][0])
    gen = torch.Generator().manual_seed(seed)
    hv = h * group
    pool = torch.randn(bsz + 2, hv, vdim, kdim, generator=gen).to(state_dtype)
    slots = torch.randperm(bsz + 2, generator=gen)[:bsz].to(torch.int32)
    truth = pool.double()
    pend = new_pending(pool, rows, h)
    r = random.Random(seed)
    counts = []
    state_tol = tol if state_dtype == torch.float32 else 1e-2
    for i, (sizes, shape, *given_accepted) in enumerate(steps):
        inp, forest = step_inputs(seed * 100 + i, sizes, shape, group, decay, dtype, h, kdim, vdim)
        tree = (inp["parents"], inp["cu_seqlens"])
        want = tree_verify_ref(*(inp[x] for x in KEYS), truth, slots, *tree)
        out = poisoned_out({"v": inp["v"]})
        call = dict(CALLS[kernel])
        if kernel.startswith("tile"):
            call["max_nodes"] = max(sizes)
        got = tree_verify(*(inp[x] for x in KEYS), pool, slots, *tree, pending=pend, out=out, **call)
        for a, b in zip(got, want):
            assert rel_err(a, b) <= tol, f"step {i}: verify off"
        drawn = [r.randint(-1, s - 1) for s in forest.sizes]
        accepted = torch.tensor(given_accepted[0] if given_accepted else drawn, dtype=torch.int32)
        truth = tree_commit_ref(truth, slots, inp["k"], want.u, want.log_p, *tree, accepted)
        tree_commit_deferred(pool, slots, inp["k"], got.u, got.log_p, *tree, accepted, pend,
                             check_trees=kernel == "auto")
        assert rel_err(pending_state_ref(pool, pend), truth) <= state_tol, f"step {i}: true state off"
        seen = pend.count[slots.long()]
        assert bool((seen == seen[:, :1]).all()), f"step {i}: a slot's heads disagree on their rows"
        counts.append(seen[:, 0].tolist())
    tree_flush(pool, pend)
    assert int(pend.count.abs().sum()) == 0
    assert rel_err(pool, truth) <= state_tol
    return counts


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    sizes=st.lists(st.integers(1, 24), min_size=1, max_size=3),
    rows=st.sampled_from([1, 4, 16]),
    group=st.sampled_from([1, 2, 4]),
    decay=st.sampled_from([(-1e-4, -1e-6), (-2.0, -0.01), (-30.0, -25.0)]),
    kernel=st.sampled_from(["auto", "tile", "tile-after", "big"]),
)
def test_deferred_steps_match_committing_every_step(seed, sizes, rows, group, decay, kernel):
    steps = [(sizes, "any")] * 4
    run_steps(steps, rows, group, decay, kernel, seed=seed, tol=1e-4 if decay[0] < -20 else 2e-5)


def test_level_kernel_reads_pending_rows():
    """Pending rows from small chains' commits, then 70- to 100-node shallow trees (wide,
    several roots) on the level kernel: it adds the rows too."""
    from test_kernel_levels import on_the_level_kernel

    steps = [([3, 4], "chain", [2, 3]), ([70, 100], "wide", [-1, -1]), ([2, 3], "chain", [1, 2]),
             ([90, 80], "roots"), ([3, 2], "chain")]
    with on_the_level_kernel():
        counts = run_steps(steps, rows=16, kernel="levels", seed=2, tol=LARGE_TREE_TOL)
    assert counts[0] == [3, 4] and counts[2] == [5, 7]


@pytest.mark.parametrize("kernel", ["auto", "tile-after"])
@pytest.mark.parametrize("h,group,kdim,vdim", [(3, 1, 24, 40), (1, 4, 8, 20)])
def test_odd_shapes(h, group, kdim, vdim, kernel):
    """Key and value dims that are not powers of two, 3 key heads, GQA 4."""
    run_steps([([4, 7], "any")] * 4, rows=5, group=group, h=h, kdim=kdim, vdim=vdim, seed=9, kernel=kernel)


def test_both_paths_run():
    """A 6-row budget over 1-3-node paths: some commits append, some write the state."""
    counts = run_steps([([3, 2], "chain")] * 6, rows=6, seed=5)
    flat = [c for step in counts for c in step]
    assert any(0 < c < 6 for c in flat) and 0 in flat[2:]


@pytest.mark.parametrize("kernel", ["big", "blocked"])
def test_big_trees_and_long_chains_read_pending_rows(kernel):
    """Pending rows from a small tree's commit, then 70- and 100-node trees and chains: the
    blocked and chain kernels add the rows too (the chain kernel only for long chains)."""
    steps = [([3, 4], "chain", [2, 3]), ([70, 100], "any", [-1, -1]), ([2, 3], "chain", [1, 2]),
             ([40, 90], "chain"), ([3, 2], "chain")]
    counts = run_steps(steps, rows=16, kernel=kernel, seed=2, tol=LARGE_TREE_TOL)
    assert counts[0] == [3, 4] and counts[2] == [5, 7]


@pytest.mark.parametrize("kernel", ["auto", "tile-after"])
@pytest.mark.parametrize("state_dtype,dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_low_precision(state_dtype, dtype, kernel):
    """A bf16 pool (written only when the rows overflow) and bf16 activations."""
    run_steps([([5, 3], "any")] * 4, rows=8, state_dtype=state_dtype, dtype=dtype, tol=2e-2, kernel=kernel)


def test_kernel_matches_the_reference_row_for_row():
    """One commit's rows and counts as tree_commit_deferred_ref writes them (append and write paths)."""
    inp, forest = step_inputs(7, [4, 6, 3], "chain", 2, (-2.0, -0.01))
    pool = torch.randn(5, 4, 16, 16)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    pend = new_pending(pool, 5, 2)
    pend.count[0] = 3  # slot 0 holds 3 rows: its 6-node chain overflows; the others append
    pend.k[0, :3].normal_()
    pend.u[0, :3].normal_()
    pend.log_p[0, :3] = torch.tensor([-0.1, -0.3, -0.7])[:, None]
    res = tree_verify_ref(*(inp[x] for x in KEYS), pool, slots, inp["parents"], inp["cu_seqlens"], pending=pend)
    accepted = torch.tensor([3, 5, 1], dtype=torch.int32)
    args = (slots, inp["k"], res.u.float(), res.log_p.float(), inp["parents"], inp["cu_seqlens"], accepted)
    want_pool, want = tree_commit_deferred_ref(pool, *args, PendingPath(*(t.clone() for t in pend)))
    got_pool = pool.clone()
    tree_commit_deferred(got_pool, *args, pend)
    assert torch.equal(pend.count, want.count) and pend.count[:, 0].tolist() == [0, 0, 2, 0, 4]
    assert rel_err(got_pool, want_pool) <= 1e-6
    for slot, n in ((4, 4), (2, 2)):
        for got_t, want_t in zip(pend[:3], want[:3]):
            assert rel_err(got_t[slot, :n], want_t[slot, :n]) <= 1e-6


def test_all_layers_in_one_launch():
    """A leading layer dim commits every layer at once, as the reference does per layer,
    over rows already there (one request's path then overflows, the other's fits)."""
    inp, _ = step_inputs(3, [5, 2], "chain", 2, (-1.0, -0.1))
    n = inp["k"].shape[0]
    layers = 3
    pool = torch.randn(layers, 4, 4, 16, 16)
    slots = torch.tensor([1, 3], dtype=torch.int32)
    k = torch.randn(layers, n, 2, 16)
    u = torch.randn(layers, n, 4, 16)
    log_p = -torch.rand(layers, n, 4).cumsum(1)
    accepted = torch.tensor([4, 1], dtype=torch.int32)
    pend = new_pending(pool, 6, 2)
    for t in pend[:2]:
        t.normal_()
    pend.log_p.copy_(-torch.rand(layers, 4, 6, 4).cumsum(2))
    pend.count[:, 1] = 2  # slot 1: 2 rows + a 5-node path > 6: written
    pend.count[:, 3] = 3  # slot 3: 3 rows + a 2-node path: appended
    want_pool, want = tree_commit_deferred_ref(pool, slots, k, u, log_p, inp["parents"], inp["cu_seqlens"],
                                               accepted, PendingPath(*(t.clone() for t in pend)))
    got = pool.clone()
    tree_commit_deferred(got, slots, k, u, log_p, inp["parents"], inp["cu_seqlens"], accepted, pend)
    assert rel_err(got, want_pool) <= 1e-6 and torch.equal(pend.count, want.count)
    assert pend.count[:, 1].unique().tolist() == [0] and pend.count[:, 3].unique().tolist() == [5]
    for a, b in zip(pend[:3], want[:3]):
        assert rel_err(a[:, 3, :5], b[:, 3, :5]) <= 1e-6


def test_launch_config():
    """config= picks the value tile and path chunk of the write path (same result); a bad one
    is one error naming config."""
    inp, _ = step_inputs(8, [9, 3], "chain", 2, (-1.0, -0.1), vdim=40)  # BV 16: three value tiles
    pool = torch.randn(2, 4, 40, 16)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    res = tree_verify_ref(*(inp[x] for x in KEYS), pool, slots, inp["parents"], inp["cu_seqlens"])
    args = (slots, inp["k"], res.u.float(), res.log_p.float(), inp["parents"], inp["cu_seqlens"],
            torch.tensor([8, 2]))
    pools = []
    for config in (None, {"BV": 16, "DP": 16, "num_warps": 2}):
        got = pool.clone()
        tree_commit_deferred(got, *args, new_pending(pool, 4, 2), config=config)  # 9 nodes > 4 rows: written
        pools.append(got)
    want, _ = tree_commit_deferred_ref(pool, *args, new_pending(pool, 4, 2))
    assert all(rel_err(p, want) <= 1e-6 for p in pools) and not torch.equal(pools[0], pool)
    with pytest.raises(InputError, match="config: BV must be a power of two"):
        tree_commit_deferred(pool.clone(), *args, new_pending(pool, 4, 2), config={"BV": 3})


def test_the_rule_picks_the_pending_form():
    """The one-tile kernel adds pending rows after the state products for trees of at most
    32 nodes from 512 request-heads (where the H200 measured it faster, I17-j), else it
    rebuilds each state slice; config= overrides the rule."""
    from bole_cli.kernels.configs import launch_config

    def form(batch, nodes, override=None):
        shape = {"K": 128, "V": 128, "HV": 32, "B": batch, "N": batch * nodes, "T": nodes}
        return launch_config("tree_verify", shape, override)["PENDING_AFTER"]

    assert [form(64, 4), form(16, 32), form(4, 4), form(64, 64)] == [1, 1, 0, 0]
    assert form(4, 4, {"PENDING_AFTER": 1}) == 1
    with pytest.raises(InputError, match="config: PENDING_AFTER must be 0 or 1"):
        form(4, 4, {"PENDING_AFTER": 2})


def test_guards_without_checks():
    """No host check (CUDA graphs): a slot outside the pool or an accepted node outside the
    tree leaves slot and rows untouched; a count outside 0..L reads as clamped."""
    inp, _ = step_inputs(4, [3, 3], "chain", 2, (-1.0, -0.1))
    pool = torch.randn(3, 4, 16, 16)
    res = tree_verify_ref(*(inp[x] for x in KEYS), pool, torch.tensor([0, 1]), inp["parents"], inp["cu_seqlens"])
    pend = new_pending(pool, 4, 2)
    before = pool.clone()
    for slots, accepted in (([7, -1], [2, 2]), ([0, 1], [5, 9])):
        tree_commit_deferred(pool, torch.tensor(slots), inp["k"], res.u.float(), res.log_p.float(),
                             inp["parents"], inp["cu_seqlens"], torch.tensor(accepted), pend, check_trees=False)
        assert torch.equal(pool, before) and int(pend.count.abs().sum()) == 0
    pend.count[1] = 99  # a corrupt count: read as 4 (the rows), so the path cannot fit: written
    pend.log_p[1] = -0.5
    clamped = PendingPath(pend.k, pend.u, pend.log_p, pend.count.clamp(0, 4))
    truth = tree_commit_ref(pending_state_ref(pool, clamped), torch.tensor([0, 1]), inp["k"], res.u,
                            res.log_p, inp["parents"], inp["cu_seqlens"], torch.tensor([-1, 2]))
    tree_commit_deferred(pool, torch.tensor([0, 1]), inp["k"], res.u.float(), res.log_p.float(), inp["parents"],
                         inp["cu_seqlens"], torch.tensor([-1, 2]), pend, check_trees=False)
    assert rel_err(pool[1], truth[1]) <= 1e-6 and pend.count[1].tolist() == [0] * 4
    assert torch.equal(pool[0], before[0])


def test_verify_clamps_a_corrupt_count():
    inp, _ = step_inputs(6, [4], "any", 2, (-1.0, -0.1))
    pool = torch.randn(2, 4, 16, 16)
    pend = new_pending(pool, 4, 2)
    for t in pend[:2]:
        t.normal_()
    pend.log_p.copy_(-torch.rand(2, 4, 4).cumsum(1))
    slots = torch.tensor([1], dtype=torch.int32)
    clamped = PendingPath(*pend[:3], torch.full_like(pend.count, 4))
    want = tree_verify_ref(*(inp[x] for x in KEYS), pool, slots, inp["parents"], inp["cu_seqlens"], pending=clamped)
    pend.count.fill_(1 << 30)
    got = tree_verify(*(inp[x] for x in KEYS), pool, slots, inp["parents"], inp["cu_seqlens"], pending=pend,
                      check_trees=False, max_nodes=4)
    assert rel_err(got.o, want.o) <= 2e-5


def test_new_pending_and_flush_name_the_argument():
    pool = torch.zeros(2, 4, 16, 16)
    for kwargs, message in (({"rows": 0, "key_heads": 2}, "rows: expected an int in 1..64"),
                            ({"rows": 65, "key_heads": 2}, "rows: expected an int in 1..64"),
                            ({"rows": 4, "key_heads": 3}, "key_heads: expected a divisor of the state's 4")):
        with pytest.raises(InputError, match=message):
            new_pending(pool, **kwargs)
    odd = PendingPath(torch.zeros(2, 4, 3, 16), *new_pending(pool, 4, 2)[1:])
    with pytest.raises(InputError, match="pending.k: 3 key heads do not divide"):
        tree_flush(pool, odd)


def test_bad_pending_names_the_field():
    inp, _ = step_inputs(1, [3], "any", 2, (-1.0, -0.1))
    pool = torch.randn(2, 4, 16, 16)
    slots = torch.tensor([0])
    verify = lambda pend: tree_verify(*(inp[x] for x in KEYS), pool, slots, inp["parents"],  # noqa: E731
                                      inp["cu_seqlens"], pending=pend)
    good = new_pending(pool, 4, 2)
    bad = {
        "pending: expected PendingPath": (good.k, good.u),
        "pending.k: 0 rows a slot": PendingPath(torch.zeros(2, 0, 2, 16), *good[1:]),
        "pending.u: expected shape": PendingPath(good.k, torch.zeros(2, 4, 4, 8), *good[2:]),
        "pending.log_p: dtype float64": PendingPath(*good[:2], good.log_p.double(), good.count),
        "pending.count: dtype int64": PendingPath(*good[:3], good.count.long()),
        "pending.k: must be contiguous": PendingPath(torch.zeros(4, 2, 2, 16).transpose(0, 1), *good[1:]),
        "pending.k: expected shape": PendingPath(torch.zeros(3, 4, 2, 16), *good[1:]),
    }
    for message, pend in bad.items():
        with pytest.raises(InputError, match=message.replace("(", r"\(")):
            verify(pend)
    corrupt = PendingPath(*good[:3], good.count.clone())
    corrupt.count[1, 3] = 2  # one head of slot 1 disagrees (and 0 is fine elsewhere)
    with pytest.raises(InputError, match="pending.count: slot 1 head 3 holds 2 rows"):
        verify(corrupt)
    corrupt.count[1] = 5
    with pytest.raises(InputError, match=r"pending.count: slot 1 head 0 holds 5 rows \(expected 0..4"):
        verify(corrupt)
    layered = new_pending(torch.zeros(2, 2, 4, 16, 16), 4, 2)
    layered.count[1, 0] = -1
    with pytest.raises(InputError, match="pending.count: layer 1, slot 0 head 0 holds -1 rows"):
        tree_flush(torch.zeros(2, 2, 4, 16, 16), layered)
    res = verify(good)
    two = dict(k=torch.randn(4, 2, 16), u=torch.randn(4, 4, 16), log_p=-torch.rand(4, 4),
               parents=torch.tensor([-1, 0, -1, 0]), cu_seqlens=torch.tensor([0, 2, 4]))
    with pytest.raises(InputError, match="state_indices: requests 0 and 1 both commit into slot 0"):
        tree_commit_deferred(pool, torch.tensor([0, 0]), *two.values(), torch.tensor([1, 0]), good)
    with pytest.raises(InputError, match="state_indices: request 0 has slot 5"):
        tree_flush(pool, good, torch.tensor([5]))
    with pytest.raises(InputError, match="flush: expected True or False"):
        tree_commit_deferred(pool, slots, inp["k"], res.u, res.log_p, inp["parents"], inp["cu_seqlens"],
                             torch.tensor([0]), good, flush=1)
