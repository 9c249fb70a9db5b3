"""The level kernel (bole_cli/kernels/tree_verify_levels.py): shallow trees past one tile,
solved level by level, against the float64 reference (CPU: Triton's interpreter; GPU: real
shapes). Outputs start as NaN, so a row the kernel forgot fails the comparison."""

from __future__ import annotations

import contextlib
import importlib
import random
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bole_cli.kernels import tree_commit, tree_verify
from bole_cli.kernels.reference import tree_commit_ref, tree_verify_ref
from bole_cli.trees import random_tree
from test_kernels import (LARGE_TREE_TOL, LaunchSpy, args, make_case, poisoned_out, rel_err, verify_odd,
                          with_empty_request)

tv = importlib.import_module("bole_cli.kernels.tree_verify")  # the module (the package exports the function)
levels = importlib.import_module("bole_cli.kernels.tree_verify_levels")  # it launches the level kernels
LEVELS = {"LEVELS": 1}


def shallow_case(seed, trees, *, h=1, group=2, kdim=16, vdim=16, decay=(-3.0, -1e-3), dtype=torch.float32,
                 device="cpu"):
    """make_case's inputs over the given trees: (size, max depth) for a random tree no
    deeper, (size, "wide") or (size, "roots")."""
    case, _ = make_case(seed, [size for size, _ in trees], h=h, group=group, kdim=kdim, vdim=vdim, decay=decay,
                        dtype=dtype, device=device)
    r = random.Random(seed)
    parents = []
    for size, kind in trees:
        if isinstance(kind, str):
            parents += list(random_tree(r, size, shape=kind).parents)
        else:
            parents += list(random_tree(r, size, max_depth=kind).parents)
    case["parents"] = torch.tensor(parents, dtype=torch.int32, device=device)
    return case


@contextlib.contextmanager
def on_the_level_kernel():
    """Fails unless tree_verify launches the level kernel inside the block (the blocked
    kernel is exact too, so the outputs alone cannot tell)."""
    launched = []
    real = levels.tree_levels_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]
    with mock.patch.object(levels, "tree_levels_kernel", Spy()):
        yield
    assert launched, "the level kernel did not run"


def deepest(case) -> int:
    return tv._forest_depths(case["parents"], case["cu_seqlens"])[0]


def check_levels(case, tol, config=None, **call):
    """Verify on the level kernel (its depth promised, no host read) and commit a random
    node of each request, both against float64."""
    sizes = (case["cu_seqlens"][1:] - case["cu_seqlens"][:-1]).tolist()
    call = {"check_trees": False, "max_depth": deepest(case), **call}
    with on_the_level_kernel():
        res = tree_verify(*args(case), out=poisoned_out(case), config=dict(LEVELS, **(config or {})), **call)
    ref = tree_verify_ref(*[x.cpu() for x in args(case)])
    for got, want in zip(res, ref):
        assert rel_err(got, want) <= tol
    r = random.Random(len(sizes))
    accepted = torch.tensor([r.randint(-1, s - 1) for s in sizes], dtype=torch.int32, device=case["v"].device)
    pool = case["state"].clone()
    tree_commit(pool, case["state_indices"], case["k"], res.u, res.log_p, case["parents"], case["cu_seqlens"],
                accepted)
    want = tree_commit_ref(case["state"].cpu(), case["state_indices"].cpu(), case["k"].cpu(), ref.u, ref.log_p,
                           case["parents"].cpu(), case["cu_seqlens"].cpu(), accepted.cpu())
    assert rel_err(pool, want) <= tol


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    size=st.integers(65, 256),
    kind=st.sampled_from([2, 8, 16, "wide", "roots"]),
    group=st.sampled_from([1, 2, 4]),
    decay=st.sampled_from([(-1e-4, -1e-6), (-2.0, -0.01), (-30.0, -1e-4)]),
    bv=st.sampled_from([16, 32]),
    rb=st.sampled_from([16, 64]),
)
@example(seed=1, size=256, kind=8, group=2, decay=(-30.0, -1e-4), bv=16, rb=64)
@example(seed=2, size=256, kind=16, group=4, decay=(-1e-4, -1e-6), bv=32, rb=16)
@example(seed=3, size=129, kind="wide", group=1, decay=(-2.0, -0.01), bv=16, rb=64)
@example(seed=4, size=200, kind="roots", group=2, decay=(-30.0, -1e-4), bv=16, rb=16)
def test_level_kernel_matches_reference(seed, size, kind, group, decay, bv, rb):
    """65-256-node shallow trees (up to 16 nodes on a path: the level kernel's range of 15
    strict ancestors) beside a small tree and a 1-node request, GQA 1/2/4, decays near 0 and
    near -30, value tiles and products blocks of several sizes."""
    case = shallow_case(seed, [(size, kind), (7, 3), (1, 1)], group=group, decay=decay)
    check_levels(case, LARGE_TREE_TOL, config={"BV": bv, "BK": 16, "RB": rb})


@pytest.mark.parametrize("gated", [False, True])
def test_level_kernel_odd_shapes(gated):
    """K = 48 and V = 72 (a masked key slice and value tile), 3 key heads at GQA 2, with
    and without the L2 norm, gates fused or not, an empty request between two others."""
    case = shallow_case(17, [(150, 8), (1, 1), (90, "roots")], h=3, group=2, kdim=48, vdim=72, decay=(-30.0, -1e-5))
    case = with_empty_request(case)
    for l2 in (True, False):
        with on_the_level_kernel():
            res, ref = verify_odd(case, gated, l2, check_trees=False, max_depth=deepest(case),
                                  config={"LEVELS": 1, "BV": 32, "BK": 32})
        for got, want in zip(res, ref):
            assert rel_err(got, want) <= LARGE_TREE_TOL


@pytest.mark.parametrize("fault", ["slot", "depth", "size"])
def test_level_kernel_faults_give_nan(fault):
    """A request whose slot lies outside the pool, deeper than the promise (the scratch has
    no column for it) or larger than the promised size: NaN rows, the others exact."""
    case = shallow_case(5, [(100, 4), (120, 12), (130, 4)], group=2)
    ref = tree_verify_ref(*args(case))
    call = {"max_depth": 12, "max_nodes": 130}
    if fault == "slot":
        case["state_indices"][0] = -1
        bad = slice(0, 100)
    elif fault == "depth":
        call["max_depth"] = 7  # the 12-deep tree breaks it: the scratch holds depths up to 7
        bad = slice(100, 220)
    else:
        call["max_nodes"] = 120  # TP 128: the 130-node tree breaks it
        bad = slice(220, 350)
    res = tree_verify(*args(case), out=poisoned_out(case), check_trees=False, config=LEVELS, **call)
    keep = torch.ones(350, dtype=torch.bool)
    keep[bad] = False
    for got, want in zip(res, ref):
        assert torch.isnan(got[bad]).all()
        assert rel_err(got[keep], want[keep]) <= LARGE_TREE_TOL


def test_level_kernel_reads_only_what_its_products_wrote(monkeypatch):
    """The level scratch starts as NaN (ancestors as -1), and the products' row blocks are
    smaller than the tree (16 rows): exact all the same, so the solve reads no entry the
    products launch left, whatever the depths of its rows."""
    real_empty = torch.empty

    def nan_empty(*a, **kw):
        t = real_empty(*a, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)

    case = shallow_case(23, [(130, 8), (66, "wide"), (1, 1)], group=2)
    depth = deepest(case)
    ref = tree_verify_ref(*args(case))
    with monkeypatch.context() as m, on_the_level_kernel():
        m.setattr(torch, "empty", nan_empty)
        res = tree_verify(*args(case), out=poisoned_out(case), check_trees=False, max_depth=depth,
                          config={"LEVELS": 1, "BV": 16, "RB": 16})
    for got, want in zip(res, ref):
        assert rel_err(got, want) <= LARGE_TREE_TOL


def test_level_kernel_treats_a_malformed_parent_as_a_root():
    """check_trees=False and a parent that does not precede its child (forward, itself or
    below -1): that node is a root, as the reference treats the repaired tree."""
    case = shallow_case(8, [(90, 5), (70, 5)], group=2)
    bad = case["parents"].clone()
    bad[50], bad[60], bad[90 + 40] = 70, 60, -7
    fixed = bad.clone()
    fixed[50], fixed[60], fixed[90 + 40] = -1, -1, -1
    with on_the_level_kernel():
        res = tree_verify(*args(dict(case, parents=bad)), out=poisoned_out(case), check_trees=False, max_depth=8,
                          config=LEVELS)
    ref = tree_verify_ref(*args(dict(case, parents=fixed)))
    for got, want in zip(res, ref):
        assert rel_err(got, want) <= LARGE_TREE_TOL


@pytest.mark.parametrize("batch,call,want", [
    (1, {"check_trees": False, "max_depth": 8}, ["levels"]),       # promised depth, 1 request x 2 heads
    (1, {}, ["levels"]),                                           # the host check reads the depth
    (1, {"check_trees": False}, ["chain", "blocked"]),             # depth unknown
    (1, {"check_trees": False, "max_depth": 16}, ["chain", "blocked"]),  # too deep to promise it
    (40, {"check_trees": False, "max_depth": 8}, ["blocked"]),     # 80 request-heads: SPLIT by the rule
    (1, {"check_trees": False, "max_depth": 8, "config": {"LEVELS": 0}}, ["blocked"]),
])
def test_shallow_trees_take_the_level_kernel_by_the_rule(monkeypatch, batch, call, want):
    """Past one tile, trees of known depth below CHAIN_KERNEL_DEPTH take the level kernel up
    to 64 request-heads (the rule); every row exact whichever kernels ran."""
    spy = LaunchSpy(monkeypatch)
    case = shallow_case(3, [(70, 6)] * batch, group=2)
    res = tree_verify(*args(case), out=poisoned_out(case), **call)
    assert spy.take() == want
    ref = tree_verify_ref(*args(case))
    for got, exp in zip(res, ref):
        assert rel_err(got, exp) <= LARGE_TREE_TOL


def test_level_kernel_at_its_deepest():
    """A 100-node tree with a 16-node path (15 strict ancestors: the scratch's last column
    at the promise 15) and bushes off it, beside a 1-node request."""
    case = shallow_case(41, [(100, "wide"), (1, 1)], group=2)
    case["parents"] = torch.tensor(list(range(-1, 15)) + [(i - 16) % 15 for i in range(16, 100)] + [-1],
                                   dtype=torch.int32)
    assert deepest(case) == 15
    check_levels(case, LARGE_TREE_TOL)


def test_solve_reads_nothing_outside_u_whatever_the_ancestors_say(monkeypatch):
    """The solve trusts no ancestor index: requests overlapping in cu_seqlens share rows of
    the level scratch, so a row can find another request's index there (-1 where a parent
    does not precede it in that request). Here the scratch is corrupted between the two
    launches (-1, the row itself, far past the tree): only ancestors before the row are read,
    so `u`, placed in a NaN-filled buffer one row in, never takes a row from outside it."""
    real = levels.tree_levels_kernel
    at = list(real.arg_names).index("ancestors")

    class Corrupting:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                anc = a[at]
                anc[::3] = -1
                anc[1::3] = torch.arange(anc.shape[0], dtype=torch.int32)[1::3, None]
                anc[2::7] = 10**6
                return real[grid](*a, **kw)
            return launch
    monkeypatch.setattr(levels, "tree_levels_kernel", Corrupting())
    case = shallow_case(5, [(130, 6)], group=2)
    o, _, log_p = poisoned_out(case)
    guarded = torch.full((131,) + o.shape[1:], float("nan"))
    res = tree_verify(*args(case), out=(o, guarded[1:], log_p), check_trees=False, max_depth=5, config=LEVELS)
    assert torch.isfinite(res.u).all() and torch.isfinite(res.o).all()


def test_the_rule_takes_levels_at_small_batches():
    """LEVELS by the rule (9B: 32 value heads): batch 1-2 past one tile, batch 4 past 192
    nodes, never from batch 16 nor for small trees on the blocked kernel."""
    from bole_cli.kernels.configs import launch_config

    def levels(batch, nodes):
        shape = {"K": 128, "V": 128, "HV": 32, "B": batch, "N": batch * nodes}
        return launch_config("tree_verify", shape)["LEVELS"]

    assert [levels(1, 128), levels(2, 256), levels(4, 256), levels(4, 192), levels(16, 256), levels(1, 40)] == \
        [1, 1, 1, 0, 0, 0]


# ---- GPU, real Qwen3.5 shapes -----------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_gpu_level_kernel_real_shapes(dtype, tol, group):
    """The level kernel at real shapes on the GPU's dots: shallow random trees of 65-256
    nodes, a wide one, several roots and a 1-node request, decays down to -30."""
    case = shallow_case(31, [(256, 8), (130, 15), (65, "wide"), (100, "roots"), (1, 1)], h=16, group=group,
                        kdim=128, vdim=128, decay=(-30.0, -1e-4), dtype=dtype, device="cuda")
    check_levels(case, tol)
