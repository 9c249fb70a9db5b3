"""The level kernel (bole_cli/kernels/tree_verify_levels.py): shallow trees past one tile,
solved level by level, against the float64 reference (CPU: Triton's interpreter; GPU: real
shapes). Outputs start as NaN, so a row the kernel forgot fails the comparison."""

from __future__ import annotations

import importlib
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bole_cli.kernels import tree_commit, tree_verify, tree_verify_gated
from bole_cli.kernels.reference import gdn_gates_ref, tree_commit_ref, tree_verify_ref
from bole_cli.trees import random_tree
from test_kernels import LARGE_TREE_TOL, LaunchSpy, args, make_case, poisoned_out, rel_err

tv = importlib.import_module("bole_cli.kernels.tree_verify")  # the module (the package exports the function)
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


def deepest(case) -> int:
    return tv._forest_depths(case["parents"], case["cu_seqlens"])[0]


def check_levels(case, tol, config=None, **call):
    """Verify on the level kernel (its depth promised, no host read) and commit a random
    node of each request, both against float64."""
    sizes = (case["cu_seqlens"][1:] - case["cu_seqlens"][:-1]).tolist()
    call = {"check_trees": False, "max_depth": deepest(case), **call}
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
    kind=st.sampled_from([2, 8, 15, "wide", "roots"]),
    group=st.sampled_from([1, 2, 4]),
    decay=st.sampled_from([(-1e-4, -1e-6), (-2.0, -0.01), (-30.0, -1e-4)]),
    bv=st.sampled_from([16, 32]),
    rb=st.sampled_from([16, 64]),
)
@example(seed=1, size=256, kind=8, group=2, decay=(-30.0, -1e-4), bv=16, rb=64)
@example(seed=2, size=256, kind=15, group=4, decay=(-1e-4, -1e-6), bv=32, rb=16)
@example(seed=3, size=129, kind="wide", group=1, decay=(-2.0, -0.01), bv=16, rb=64)
@example(seed=4, size=200, kind="roots", group=2, decay=(-30.0, -1e-4), bv=16, rb=16)
def test_level_kernel_matches_reference(seed, size, kind, group, decay, bv, rb):
    """65-256-node shallow trees (depth up to 15: the level kernel's range) beside a small
    tree and a 1-node request, GQA 1/2/4, decays near 0 and near -30, value tiles and
    products blocks of several sizes."""
    case = shallow_case(seed, [(size, kind), (7, 3), (1, 1)], group=group, decay=decay)
    check_levels(case, LARGE_TREE_TOL, config={"BV": bv, "BK": 16, "RB": rb})


@pytest.mark.parametrize("gated", [False, True])
def test_level_kernel_odd_shapes(gated):
    """K = 48 and V = 72 (a masked key slice and value tile), 3 key heads at GQA 2, with
    and without the L2 norm, gates fused or not, an empty request between two others."""
    case = shallow_case(17, [(150, 8), (1, 1), (90, "roots")], h=3, group=2, kdim=48, vdim=72, decay=(-30.0, -1e-5))
    case = dict(case, cu_seqlens=torch.tensor([0, 150, 150, 151, 241], dtype=torch.int32),
                state_indices=torch.cat([case["state_indices"][:1], case["state_indices"][2:3],
                                         case["state_indices"][1:]]))
    call = dict(check_trees=False, max_depth=deepest(case), config={"LEVELS": 1, "BV": 32, "BK": 32})
    for l2 in (True, False):
        if gated:
            n, hv = case["g"].shape
            gen = torch.Generator().manual_seed(3)
            a, b = torch.randn(n, hv, generator=gen) * 3, torch.randn(n, hv, generator=gen)
            A_log, dt_bias = torch.linspace(-4.0, math.log(30.0), hv), torch.randn(hv, generator=gen)
            g, beta = gdn_gates_ref(A_log, a, dt_bias, b)
            ref = tree_verify_ref(*args(dict(case, g=g.float(), beta=beta.float())), use_qk_l2norm=l2)
            res = tree_verify_gated(case["q"], case["k"], case["v"], a, b, A_log, dt_bias, case["state"],
                                    case["state_indices"], case["parents"], case["cu_seqlens"], use_qk_l2norm=l2,
                                    out=poisoned_out(case), **call)
        else:
            ref = tree_verify_ref(*args(case), use_qk_l2norm=l2)
            res = tree_verify(*args(case), use_qk_l2norm=l2, out=poisoned_out(case), **call)
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
    with monkeypatch.context() as m:
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
