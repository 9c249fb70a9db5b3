"""Bad input to the kernels (docs/design.md §3): one InputError naming the argument, or,
under check_trees=False (CUDA graphs: no host read), no access outside the pool.

Pools are views into a larger buffer with a canary slot on each side: a write to slot -1
or S would land in a canary, so "the pool is untouched" is checked on every byte around it.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels import VerifyResult, gdn_gates, tree_commit, tree_conv, tree_conv_commit
from bole_cli.kernels import tree_verify, tree_verify_gated
from bole_cli.kernels.reference import tree_commit_ref, tree_conv_commit_ref, tree_conv_ref, tree_verify_ref
from bole_cli.trees import random_forest
from test_kernels import _inside_padding, args, make_case, poisoned_out, rel_err

SIZES = [6, 9, 4]  # request 1 gets the bad slot
BAD_SLOTS = [-1, -7, 5, 6, 10**9, 2**40]  # the pool has 5 slots (SIZES + 2 spare)
FAST = settings(max_examples=6, deadline=None, derandomize=True)
PATHS = {"tile": {"check_trees": False, "max_nodes": max(SIZES)}, "blocked": {"check_trees": False},
         "split": {"check_trees": False, "config": {"SPLIT": 1}}}  # the blocked kernel after its parts


def guarded(pool: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): the pool inside a buffer with one canary slot before and after."""
    shape = list(pool.shape)
    shape[dim] += 2
    buf = torch.full(shape, 1234.5, dtype=pool.dtype)
    view = buf.narrow(dim, 1, pool.shape[dim])
    view.copy_(pool)
    return buf, view


def verify_case(seed=3, dtype=torch.float32):
    case, forest = make_case(seed, SIZES, h=1, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01),
                             dtype=dtype, slots_extra=2)
    return case, forest


def with_slot(case, bad):
    idx = case["state_indices"].to(torch.int64).clone()
    idx[1] = bad
    return dict(case, state_indices=idx)


def zeroed_out(case):
    """Outputs preset to 0, so a NaN can only come from the kernel."""
    return VerifyResult(*(torch.zeros_like(t) for t in poisoned_out(case)))


def node_rows(forest, b):
    start = sum(forest.sizes[:b])
    return slice(start, start + forest.sizes[b])


def conv_case(seed=5, width=4):
    forest = random_forest(random.Random(seed), SIZES)
    parents, cu = forest.to_torch()
    gen = torch.Generator().manual_seed(seed)
    n, dim = forest.n_nodes, 24
    x = torch.randn(n, dim, generator=gen)
    conv_state = torch.randn(len(SIZES) + 2, dim, width - 1, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    idx = torch.randperm(len(SIZES) + 2, generator=gen)[: len(SIZES)].to(torch.int64)
    return dict(x=x, conv_state=conv_state, weight=weight, bias=bias, idx=idx, parents=parents, cu=cu), forest


# ---- out-of-range slots ----------------------------------------------------------------

@pytest.mark.parametrize("path", ["auto", "tile"])
@pytest.mark.parametrize("bad", [-1, 5, 2**40])
def test_bad_slot_is_refused_when_checking(path, bad):
    case, forest = verify_case()
    extra = {"auto": {}, "tile": {"max_nodes": max(SIZES)}}[path]
    with pytest.raises(InputError, match=r"^state_indices: request 1 has slot"):
        tree_verify(*args(with_slot(case, bad)), **extra)
    res = tree_verify(*args(case))
    accepted = torch.tensor([0, 1, -1], dtype=torch.int32)
    with pytest.raises(InputError, match=r"^state_indices: request 1 has slot"):
        tree_commit(case["state"].clone(), with_slot(case, bad)["state_indices"], case["k"], res.u, res.log_p,
                    case["parents"], case["cu_seqlens"], accepted)
    c, _ = conv_case()
    bad_idx = c["idx"].clone()
    bad_idx[1] = bad
    with pytest.raises(InputError, match=r"^state_indices: request 1 has slot"):
        tree_conv(c["x"], c["conv_state"], c["weight"], c["bias"], bad_idx, c["parents"], c["cu"])
    with pytest.raises(InputError, match=r"^state_indices: request 1 has slot"):
        tree_conv_commit(c["conv_state"].clone(), c["x"], bad_idx, c["parents"], c["cu"], accepted)


@FAST
@given(bad=st.sampled_from(BAD_SLOTS), path=st.sampled_from(["tile", "blocked", "split"]), gated=st.booleans())
def test_bad_slot_without_checks_gives_nan_and_reads_nothing(bad, path, gated):
    """The request with the bad slot: NaN o, u, log_p; the others exact; the pool and its
    canaries bitwise unchanged (verify never writes the pool)."""
    case, forest = verify_case()
    buf, pool = guarded(case["state"])
    before = buf.clone()
    bad_case = dict(with_slot(case, bad), state=pool)
    if gated:
        gen = torch.Generator().manual_seed(1)
        n, hv = case["g"].shape
        a, b = torch.randn(n, hv, generator=gen), torch.randn(n, hv, generator=gen)
        A_log, dt_bias = torch.randn(hv, generator=gen), torch.randn(hv, generator=gen)
        from bole_cli.kernels.reference import gdn_gates_ref

        g, beta = gdn_gates_ref(A_log, a, dt_bias, b)
        ref = tree_verify_ref(*args(dict(case, g=g.float(), beta=beta.float())))
        res = tree_verify_gated(bad_case["q"], bad_case["k"], bad_case["v"], a, b, A_log, dt_bias, pool,
                                bad_case["state_indices"], case["parents"], case["cu_seqlens"],
                                out=zeroed_out(case), **PATHS[path])
    else:
        ref = tree_verify_ref(*args(case))
        res = tree_verify(*args(bad_case), out=zeroed_out(case), **PATHS[path])
    assert torch.equal(buf, before)
    bad_rows = node_rows(forest, 1)
    for got, want in zip(res, ref):
        assert torch.isnan(got[bad_rows]).all()
        for b in (0, 2):
            assert rel_err(got[node_rows(forest, b)], want[node_rows(forest, b)]) <= 1e-5


@FAST
@given(bad=st.sampled_from(BAD_SLOTS), layered=st.booleans())
def test_bad_slot_without_checks_is_never_committed(bad, layered):
    """tree_commit (one layer, or all layers in one launch) skips the request: its slot, the
    canaries around the pool and every untouched slot keep their bytes."""
    case, forest = verify_case()
    res = tree_verify(*args(case))
    accepted = torch.tensor([3, 8, 2], dtype=torch.int32)
    state, k, u, log_p = case["state"], case["k"], res.u, res.log_p
    if layered:  # two layers: the second a scaled copy of the first
        state, k, u, log_p = (torch.stack([t, 0.5 * t]) for t in (state, k, u, log_p))
    buf, pool = guarded(state, dim=1 if layered else 0)
    before = buf.clone()
    idx = with_slot(case, bad)["state_indices"]
    tree_commit(pool, idx, k, u, log_p, case["parents"], case["cu_seqlens"], accepted, check_trees=False)
    skip = torch.tensor([3, -1, 2], dtype=torch.int32)  # what must have happened
    want = tree_commit_ref(state, case["state_indices"], k, u, log_p, case["parents"], case["cu_seqlens"], skip)
    assert rel_err(pool, want) <= 1e-5
    good = {int(case["state_indices"][b]) for b in (0, 2)}
    lead = (slice(None),) if layered else ()
    for s in range(-1, pool.shape[1 if layered else 0] + 1):  # -1 and S: the canaries
        if s not in good:
            assert torch.equal(buf[lead + (s + 1,)], before[lead + (s + 1,)]), s


def test_accepted_node_of_an_empty_request_commits_nothing():
    """Without checks, an empty last request that claims an accepted node (its tree starts at
    N, past every factor row) leaves its slot alone; the others commit as usual."""
    case, forest = verify_case()
    res = tree_verify(*args(case))
    n = case["parents"].shape[0]
    cu = torch.cat([case["cu_seqlens"], torch.tensor([n], dtype=case["cu_seqlens"].dtype)])
    spare = min(set(range(case["state"].shape[0])) - set(case["state_indices"].tolist()))  # unused
    idx = torch.cat([case["state_indices"], torch.tensor([spare], dtype=case["state_indices"].dtype)])
    state = case["state"].clone()
    before = state[spare].clone()
    tree_commit(state, idx, case["k"], res.u, res.log_p, case["parents"], cu,
                torch.tensor([3, 8, 2, 0], dtype=torch.int32), check_trees=False)
    want = tree_commit_ref(case["state"], case["state_indices"], case["k"], res.u, res.log_p,
                           case["parents"], case["cu_seqlens"], torch.tensor([3, 8, 2], dtype=torch.int32))
    assert torch.equal(state[spare], before)
    used = case["state_indices"].long()
    assert rel_err(state[used], want[used]) <= 1e-5



@pytest.mark.skipif(sys.platform == "win32", reason="PROT_NONE guard pages need a POSIX libc (mprotect)")
def test_the_kernels_touch_nothing_outside_their_arguments():
    """Every argument flush against a page the process may not touch (before, then after it),
    under offsets and accepted nodes no tree of the contract has (an empty last request
    claiming a node, a request pushed past N, offsets below 0 and huge ones): both commits on
    the node-by-node and the passes routes, the verify on each route, both conv kernels, the
    plug-in's conv-window commit and slot seeding. A read
    whose value never reaches an output (a request that stores nothing) faults too, which NaN
    padding cannot show (tests/guard_pages.py)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).with_name("guard_pages.py")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    last = (run.stdout.strip().splitlines() or ["(nothing)"])[-1]
    assert run.returncode == 0 and last == "all cases ran", f"exit {run.returncode} at {last!r}: {run.stderr[-800:]}"


@pytest.mark.parametrize("kernel,sizes,accepted", [
    ("tree_commit", [9, 12], [5, 11]),
    ("replay", [9, 12], [5, 11]),
    ("replay", [70, 9], [69, 8]),  # a 70-node path: the passes kernel
], ids=["tree_commit", "replay", "replay-passes"])
def test_garbage_offsets_keep_the_commits_inside_the_rows(kernel, sizes, accepted):
    """Without checks, the commits clamp cu_seqlens to the N nodes as the verify does: a first
    offset below 0 commits the clamped forest's path (the same state as the clean offsets), a
    request pushed past N so that its accepted node leaves the clamped tree is not committed.
    Every row before and after the inputs holds NaN (-1 for parents): a read there would show."""
    from bole_cli.kernels import tree_commit_replay

    case, _ = make_case(7, sizes, h=1, group=2, kdim=16, vdim=16, decay=(-0.5, -0.01), shape="chain",
                        slots_extra=2)
    n, acc = sum(sizes), torch.tensor(accepted, dtype=torch.int32)
    bad_cu = torch.tensor([-3, sizes[0] + 3, n + 3], dtype=torch.int32)
    if kernel == "tree_commit":
        res = tree_verify(*args(case))
        rows = [case["k"], res.u, res.log_p]

        def commit(state, rows_, parents, cu, a):
            return tree_commit(state, case["state_indices"], *rows_, parents, cu, a, check_trees=False)
    else:
        rows = [case[x] for x in ("k", "v", "g", "beta")]

        def commit(state, rows_, parents, cu, a):
            return tree_commit_replay(state, case["state_indices"], *rows_, parents, cu, a, check_trees=False)
    clean = commit(case["state"].clone(), rows, case["parents"], case["cu_seqlens"], acc)
    got = commit(case["state"].clone(), [_inside_padding(t, float("nan"))[0] for t in rows],
                 _inside_padding(case["parents"], -1)[0], bad_cu, acc)
    first, second = (int(x) for x in case["state_indices"])
    assert torch.equal(got[first], clean[first])
    assert torch.equal(got[second], case["state"][second])
    assert not torch.equal(clean[second], case["state"][second])  # the clean offsets do commit it


@FAST
@given(bad=st.sampled_from(BAD_SLOTS))
def test_conv_bad_slot_without_checks(bad):
    """tree_conv: that request's rows NaN, the others exact, the window never read;
    tree_conv_commit: that slot and the canaries untouched."""
    c, forest = conv_case()
    buf, pool = guarded(c["conv_state"])
    before = buf.clone()
    idx = c["idx"].clone()
    idx[1] = bad
    y = tree_conv(c["x"], pool, c["weight"], c["bias"], idx, c["parents"], c["cu"], check_trees=False)
    want = tree_conv_ref(c["x"], c["conv_state"], c["weight"], c["bias"], c["idx"], c["parents"], c["cu"])
    assert torch.isnan(y[node_rows(forest, 1)]).all()
    for b in (0, 2):
        assert rel_err(y[node_rows(forest, b)], want[node_rows(forest, b)]) <= 1e-5
    assert torch.equal(buf, before)
    accepted = torch.tensor([5, 8, 3], dtype=torch.int32)
    tree_conv_commit(pool, c["x"], idx, c["parents"], c["cu"], accepted, check_trees=False)
    skip = torch.tensor([5, -1, 3], dtype=torch.int32)
    want = tree_conv_commit_ref(c["conv_state"], c["x"], c["idx"], c["parents"], c["cu"], skip)
    assert torch.equal(pool, want)
    assert torch.equal(buf[0], before[0]) and torch.equal(buf[-1], before[-1])


WRAPS = 2 ** 32  # an int64 entry this far out has the low 32 bits of a node inside the tree


@pytest.mark.parametrize("accepted,dtype", [([3, 9, 4000], torch.int32), ([3, WRAPS + 2, 1 - WRAPS], torch.int64)],
                         ids=["past-the-tree", "int64-wrapping-into-the-tree"])
def test_accepted_outside_the_tree_without_checks_leaves_the_slot(accepted, dtype):
    """accepted[b] >= the request's node count, or an int64 entry whose low 32 bits name a node
    of the tree (no host check): the commits skip it, instead of reading another request's (or
    no request's) factors or committing the node the truncated value names."""
    case, forest = verify_case()
    res = tree_verify(*args(case))
    pool = case["state"].clone()
    accepted = torch.tensor(accepted, dtype=dtype)  # request 1 has 9 nodes, request 2 has 4
    tree_commit(pool, case["state_indices"], case["k"], res.u, res.log_p, case["parents"], case["cu_seqlens"],
                accepted, check_trees=False)
    skip = torch.tensor([3, -1, -1], dtype=torch.int32)
    want = tree_commit_ref(case["state"], case["state_indices"], case["k"], res.u, res.log_p, case["parents"],
                           case["cu_seqlens"], skip)
    assert rel_err(pool, want) <= 1e-5
    for b in (1, 2):
        slot = int(case["state_indices"][b])
        assert torch.equal(pool[slot], case["state"][slot])
    c, _ = conv_case()
    conv = c["conv_state"].clone()
    tree_conv_commit(conv, c["x"], c["idx"], c["parents"], c["cu"], accepted, check_trees=False)
    assert torch.equal(conv, tree_conv_commit_ref(c["conv_state"], c["x"], c["idx"], c["parents"], c["cu"], skip))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("sizes,wrapping,committed", [
    ([6, 9, 4], [3, WRAPS + 2, 1 - WRAPS], 0),
    ([70, 9, 4], [WRAPS + 69, 8, 1 - WRAPS], 1),  # node 69 of a 70-node chain: the passes kernel's path
], ids=["short-paths", "a-70-node-path"])
def test_int64_accepted_past_2_31_commits_nothing(sizes, wrapping, committed, device):
    """tree_commit, the replay commit (both routes) and the plug-in's conv-window commit
    compare accepted at its own width: 2^32 + a and 1 - 2^32 (nodes a and 1 once truncated to
    int32) leave their slots exactly as accepted = -1 does; the request `committed` commits as
    usual. On the GPU too: the compiled kernels compare as the interpreter does."""
    from bole_cli.kernels import tree_commit_replay
    from bole_cli.kernels.conv_window_commit import conv_window_commit

    case, _ = make_case(11, sizes, h=1, group=2, kdim=16, vdim=16, decay=(-0.5, -0.01), shape="chain",
                        slots_extra=2, device=device)
    idx, parents, cu = case["state_indices"], case["parents"], case["cu_seqlens"]
    skip = torch.tensor([a if b == committed else -1 for b, a in enumerate(wrapping)], dtype=torch.int64,
                        device=device)
    wrapping = torch.tensor(wrapping, dtype=torch.int64, device=device)
    gen = torch.Generator().manual_seed(2)
    n, hv, slots = sum(sizes), case["v"].shape[1], case["state"].shape[0]
    u, log_p = torch.randn(n, hv, 16, generator=gen).to(device), -torch.rand(n, hv, generator=gen).to(device)
    conv, x, prev = (torch.randn(shape, generator=gen).to(device)
                     for shape in ((1, slots, 8, 3), (1, n, 8), (1, len(sizes), 8, 3)))
    rows = [case[name] for name in ("k", "v", "g", "beta")]

    def window_commit(acc):
        out = conv.clone()
        conv_window_commit(out, x, prev, idx, parents, cu, acc)
        return out
    slot = int(idx[committed])
    commits = {  # name: (commit(accepted) -> the pool after it, the pool before, its slot `slot`)
        "tree_commit": (lambda acc: tree_commit(case["state"].clone(), idx, case["k"], u, log_p, parents, cu, acc,
                                                check_trees=False), case["state"], lambda t: t[slot]),
        "replay": (lambda acc: tree_commit_replay(case["state"].clone(), idx, *rows, parents, cu, acc,
                                                  check_trees=False), case["state"], lambda t: t[slot]),
        "conv_window_commit": (window_commit, conv, lambda t: t[:, slot])}
    for name, (commit, before, at_slot) in commits.items():
        got, want = commit(wrapping), commit(skip)
        assert torch.equal(got, want), name
        assert not torch.equal(at_slot(want), at_slot(before)), name  # the request `committed` did commit


# ---- duplicate commit slots --------------------------------------------------------------

def test_duplicate_commit_slots_are_refused_when_checking():
    case, forest = verify_case()
    res = tree_verify(*args(case))
    idx = case["state_indices"].clone()
    idx[2] = idx[0]
    with pytest.raises(InputError, match=r"^state_indices: requests 0 and 2 both commit into slot"):
        tree_commit(case["state"].clone(), idx, case["k"], res.u, res.log_p, case["parents"],
                    case["cu_seqlens"], torch.tensor([1, 2, 3], dtype=torch.int32))
    # a shared slot that only one request writes is well defined
    pool = case["state"].clone()
    tree_commit(pool, idx, case["k"], res.u, res.log_p, case["parents"], case["cu_seqlens"],
                torch.tensor([1, 2, -1], dtype=torch.int32))
    c, _ = conv_case()
    cidx = c["idx"].clone()
    cidx[1] = cidx[0]
    with pytest.raises(InputError, match=r"^state_indices: requests 0 and 1 both commit into slot"):
        tree_conv_commit(c["conv_state"].clone(), c["x"], cidx, c["parents"], c["cu"],
                         torch.tensor([0, 0, 0], dtype=torch.int32))


# ---- strided 1-D arguments ----------------------------------------------------------------

def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a buffer (the kernel would read the gaps)."""
    buf = torch.full((2 * t.shape[0],) + tuple(t.shape[1:]), -3, dtype=t.dtype)
    buf[::2] = t
    view = buf[::2]
    assert not view.is_contiguous()
    return view


@pytest.mark.parametrize("name", ["parents", "cu_seqlens", "state_indices"])
@pytest.mark.parametrize("path", ["tile", "blocked"])
def test_strided_index_vectors_give_the_same_verify(name, path):
    case, forest = verify_case()
    want = tree_verify(*args(case), **PATHS[path])
    got = tree_verify(*args(dict(case, **{name: strided(case[name])})), **PATHS[path])
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["parents", "cu_seqlens", "state_indices", "accepted"])
def test_strided_index_vectors_give_the_same_commit(name):
    case, forest = verify_case()
    res = tree_verify(*args(case))
    vec = dict(parents=case["parents"], cu_seqlens=case["cu_seqlens"], state_indices=case["state_indices"],
               accepted=torch.tensor([5, 8, 3], dtype=torch.int32))
    want = case["state"].clone()
    tree_commit(want, vec["state_indices"], case["k"], res.u, res.log_p, vec["parents"], vec["cu_seqlens"],
                vec["accepted"])
    vec[name] = strided(vec[name])
    got = case["state"].clone()
    tree_commit(got, vec["state_indices"], case["k"], res.u, res.log_p, vec["parents"], vec["cu_seqlens"],
                vec["accepted"])
    assert torch.equal(got, want)


def test_strided_gate_and_conv_parameters():
    case, forest = verify_case()
    gen = torch.Generator().manual_seed(2)
    n, hv = case["g"].shape
    a, b = torch.randn(n, hv, generator=gen), torch.randn(n, hv, generator=gen)
    A_log, dt_bias = torch.randn(hv, generator=gen), torch.randn(hv, generator=gen)
    common = (case["state"], case["state_indices"], case["parents"], case["cu_seqlens"])
    want = tree_verify_gated(case["q"], case["k"], case["v"], a, b, A_log, dt_bias, *common)
    got = tree_verify_gated(case["q"], case["k"], case["v"], a, b, strided(A_log), strided(dt_bias), *common)
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    a2, b2 = torch.randn(n, hv, generator=gen), torch.randn(n, hv, generator=gen)
    want = gdn_gates(A_log, a2, dt_bias, b2)
    got = gdn_gates(strided(A_log), a2, strided(dt_bias), b2)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    c, _ = conv_case()
    want = tree_conv(c["x"], c["conv_state"], c["weight"], c["bias"], c["idx"], c["parents"], c["cu"])
    weight_t = c["weight"].t().contiguous().t()  # [D, W] with the taps strided
    assert weight_t.stride(1) != 1
    got = tree_conv(c["x"], c["conv_state"], weight_t, strided(c["bias"]), strided(c["idx"]),
                    strided(c["parents"]), strided(c["cu"]))
    assert torch.equal(got, want)
    accepted = torch.tensor([5, 8, 3], dtype=torch.int32)
    want_pool, got_pool = c["conv_state"].clone(), c["conv_state"].clone()
    tree_conv_commit(want_pool, c["x"], c["idx"], c["parents"], c["cu"], accepted)
    tree_conv_commit(got_pool, c["x"], strided(c["idx"]), strided(c["parents"]), strided(c["cu"]),
                     strided(accepted))
    assert torch.equal(got_pool, want_pool)


# ---- wrong types, empty dimensions, configs, meta tensors, scale ---------------------------

def _verify_with(**change):
    case, _ = verify_case()
    kwargs = {key: change.pop(key) for key in list(change) if key not in case}
    return lambda: tree_verify(*args(dict(case, **change)), **kwargs)


def _commit_with(**change):
    case, _ = verify_case()
    res = tree_verify(*args(case))
    call = dict(state=case["state"].clone(), state_indices=case["state_indices"], k=case["k"], u=res.u,
                log_p=res.log_p, parents=case["parents"], cu_seqlens=case["cu_seqlens"],
                accepted=torch.tensor([1, 2, 3], dtype=torch.int32))
    kwargs = {key: change.pop(key) for key in list(change) if key not in call}
    call.update(change)
    return lambda: tree_commit(*call.values(), **kwargs)


def _conv_with(commit=False, **change):
    c, _ = conv_case()
    if commit:
        call = dict(conv_state=c["conv_state"].clone(), x=c["x"], state_indices=c["idx"], parents=c["parents"],
                    cu_seqlens=c["cu"], accepted=torch.tensor([1, 2, 3], dtype=torch.int32))
        fn = tree_conv_commit
    else:
        call = dict(x=c["x"], conv_state=c["conv_state"], weight=c["weight"], bias=c["bias"],
                    state_indices=c["idx"], parents=c["parents"], cu_seqlens=c["cu"])
        fn = tree_conv
    kwargs = {key: change.pop(key) for key in list(change) if key not in call}
    call.update(change)
    return lambda: fn(*call.values(), **kwargs)


def _gated_with(**change):
    case, _ = verify_case()
    n, hv = case["g"].shape
    call = dict(q=case["q"], k=case["k"], v=case["v"], a=torch.zeros(n, hv), b=torch.zeros(n, hv),
                A_log=torch.zeros(hv), dt_bias=torch.zeros(hv), state=case["state"],
                state_indices=case["state_indices"], parents=case["parents"], cu_seqlens=case["cu_seqlens"])
    call.update(change)
    return lambda: tree_verify_gated(*call.values())


def _gates_with(**change):
    call = dict(A_log=torch.zeros(4), a=torch.zeros(5, 4), dt_bias=torch.zeros(4), b=torch.zeros(5, 4))
    call.update(change)
    return lambda: gdn_gates(*call.values())


BAD_CALLS = {
    # wrong types
    "q list": (lambda: _verify_with(q=[[[1.0]]]), r"^q: expected a torch.Tensor, got list"),
    "v list": (lambda: _verify_with(v=[1.0]), r"^v: expected a torch.Tensor, got list"),
    "gated a list": (lambda: _gated_with(a=[0.0]), r"^a: expected a torch.Tensor, got list"),
    "gated q list": (lambda: _gated_with(q=[0.0]), r"^q: expected a torch.Tensor, got list"),
    "gated A_log None": (lambda: _gated_with(A_log=None), r"^A_log: expected a torch.Tensor, got NoneType"),
    "commit state list": (lambda: _commit_with(state=[0.0]), r"^state: expected \[S, HV, V, K\]"),
    "commit k list": (lambda: _commit_with(k=[0.0]), r"^k: expected a torch.Tensor, got list"),
    "conv x list": (lambda: _conv_with(x=[[0.0]]), r"^x: expected a torch.Tensor, got list"),
    "conv commit x list": (lambda: _conv_with(commit=True, x=[[0.0]]), r"^x: expected a torch.Tensor"),
    "gates a list": (lambda: _gates_with(a=[[0.0]]), r"^a: expected a torch.Tensor, got list"),
    "parents list": (lambda: _verify_with(parents=[-1, 0]), r"^parents: expected a torch.Tensor"),
    # empty feature dimensions
    "K=0": (lambda: _verify_with(q=torch.zeros(19, 1, 0), k=torch.zeros(19, 1, 0)), r"^q: dimension K"),
    "H=0": (lambda: _verify_with(q=torch.zeros(19, 0, 16), k=torch.zeros(19, 0, 16)), r"^q: dimension H"),
    "V=0": (lambda: _verify_with(v=torch.zeros(19, 2, 0)), r"^v: dimension V"),
    "HV=0": (lambda: _verify_with(v=torch.zeros(19, 0, 16)), r"^v: dimension HV"),
    "commit K=0": (lambda: _commit_with(state=torch.zeros(5, 2, 16, 0)), r"^state: dimension K"),
    "conv D=0": (lambda: _conv_with(x=torch.zeros(19, 0)), r"^x: dimension D"),
    "conv W=0": (lambda: _conv_with(weight=torch.zeros(24, 0)), r"^weight: dimension W"),
    "gates HV=0": (lambda: _gates_with(a=torch.zeros(5, 0), b=torch.zeros(5, 0)), r"^a: dimension HV"),
    # configs
    "config unknown key": (lambda: _verify_with(config={"BLOCK": 32}), r"^config: unknown keys \['BLOCK'\]"),
    "config BV 24": (lambda: _verify_with(config={"BV": 24}), r"^config: BV must be a power of two"),
    "config BK str": (lambda: _verify_with(config={"BK": "32"}), r"^config: BK must be a power of two"),
    "config BC 8": (lambda: _verify_with(config={"BC": 8}), r"^config: BC must be a power of two in 16"),
    "config warps 3": (lambda: _verify_with(config={"num_warps": 3}), r"^config: num_warps"),
    "config stages 0": (lambda: _verify_with(config={"num_stages": 0}), r"^config: num_stages"),
    "config precision": (lambda: _verify_with(config={"precision": "fp64"}), r"^config: precision"),
    "config list": (lambda: _verify_with(config=["BV"]), r"^config: expected a dict"),
    "config CHAIN 2": (lambda: _verify_with(config={"CHAIN": 2}), r"^config: CHAIN must be 0 or 1"),
    "max_depth bool": (lambda: _verify_with(max_depth=True), r"^max_depth: expected an int in 0\.\.255"),
    "max_depth -1": (lambda: _verify_with(max_depth=-1), r"^max_depth: expected an int in 0\.\.255"),
    "max_depth 256": (lambda: _verify_with(max_depth=256), r"^max_depth: expected an int in 0\.\.255"),
    "max_depth float": (lambda: _verify_with(max_depth=2.0), r"^max_depth: expected an int in 0\.\.255"),
    "commit DP 8": (lambda: _commit_with(config={"DP": 8}), r"^config: DP must be a power of two"),
    "commit BV bool": (lambda: _commit_with(config={"BV": True}), r"^config: BV must be a power of two"),
    "conv BD 100": (lambda: _conv_with(config={"BD": 100}), r"^config: BD must be a power of two"),
    "conv commit BD 0": (lambda: _conv_with(commit=True, config={"BD": 0}), r"^config: BD must be"),
    # meta tensors
    "meta q": (lambda: _verify_with(q=torch.zeros(19, 1, 16, device="meta")), r"^q: a meta tensor"),
    "meta state": (lambda: _commit_with(state=torch.zeros(5, 2, 16, 16, device="meta")), r"^state: a meta"),
    "meta x": (lambda: _conv_with(x=torch.zeros(19, 24, device="meta")), r"^x: a meta tensor"),
    # scale and flags
    "scale nan": (lambda: _verify_with(scale=float("nan")), r"^scale: expected a finite number"),
    "scale inf": (lambda: _verify_with(scale=float("-inf")), r"^scale: expected a finite number"),
    "scale str": (lambda: _verify_with(scale="0.1"), r"^scale: expected a finite number"),
    "scale bool": (lambda: _verify_with(scale=True), r"^scale: expected a finite number"),
    "l2norm str": (lambda: _verify_with(use_qk_l2norm="yes"), r"^use_qk_l2norm: expected True or False"),
    "activation int": (lambda: _conv_with(activation=2), r"^activation: expected True or False"),
    # outputs given
    "out u bf16": (lambda: _verify_with(out=VerifyResult(torch.zeros(19, 2, 16), torch.zeros(19, 2, 16).bfloat16(),
                                                         torch.zeros(19, 2))), r"^out.u: dtype bfloat16"),
    "out o strided": (lambda: _verify_with(out=VerifyResult(torch.zeros(19, 2, 32)[:, :, ::2], torch.zeros(19, 2, 16),
                                                            torch.zeros(19, 2))), r"^out.o: the last dimension"),
    "out short": (lambda: _verify_with(out=(torch.zeros(19, 2, 16),)), r"^out: expected \(o, u, log_p\)"),
    "out o rows overlap": (lambda: _verify_with(out=VerifyResult(torch.zeros(1, 2, 16).expand(19, 2, 16),
                                                                 torch.zeros(19, 2, 16), torch.zeros(19, 2))),
                           r"^out.o: its elements overlap"),
    "out log_p heads overlap": (lambda: _verify_with(out=VerifyResult(torch.zeros(19, 2, 16), torch.zeros(19, 2, 16),
                                                                      torch.zeros(20).as_strided((19, 2), (1, 1)))),
                                r"^out.log_p: its elements overlap"),
    "conv out rows overlap": (lambda: _conv_with(out=torch.zeros(1, 24).expand(19, 24)), r"^out: its elements overlap"),
}


@pytest.mark.parametrize("which", sorted(BAD_CALLS))
def test_bad_input_is_one_named_error(which):
    make, pattern = BAD_CALLS[which]
    call = make()
    with pytest.raises(InputError, match=pattern):
        call()


def test_empty_batches_are_fine():
    """No nodes, no requests, no slots, no layers: valid, nothing to do."""
    case, _ = verify_case()
    empty = dict(case, q=case["q"][:0], k=case["k"][:0], v=case["v"][:0], g=case["g"][:0], beta=case["beta"][:0],
                 parents=case["parents"][:0], cu_seqlens=torch.zeros(4, dtype=torch.int32))
    res = tree_verify(*args(empty))
    assert res.o.shape == (0, 2, 16)
    none = dict(empty, state=case["state"][:0], state_indices=case["state_indices"][:0],
                cu_seqlens=torch.zeros(1, dtype=torch.int32))
    tree_verify(*args(none))
    pool = case["state"][None, :].clone()[:0]
    tree_commit(pool, case["state_indices"], case["k"][None][:0], torch.zeros(0, 19, 2, 16), torch.zeros(0, 19, 2),
                case["parents"], case["cu_seqlens"], torch.tensor([1, 2, 3], dtype=torch.int32))


def test_a_bad_tuned_entry_is_ignored_with_one_note(monkeypatch, capsys):
    """A hand-edited table (DP 8, BV 24) must not reach Triton; the launch keeps its default."""
    from bole_cli.kernels import configs

    shape = {"K": 128, "V": 128, "HV": 32, "B": 16, "L": 1}
    monkeypatch.setattr(configs, "tuned_config", lambda kernel, shape: None)
    default = configs.launch_config("tree_commit", shape)
    monkeypatch.setattr(configs, "tuned_config", lambda kernel, shape: {"DP": 8, "BV": 24})
    assert configs.launch_config("tree_commit", shape) == default
    assert "a tuned tree_commit entry was ignored" in capsys.readouterr().err


def test_commit_checks_only_the_slots_it_writes():
    """With checks on, a padding row (accepted -1) may carry slot -1 as SGLang's graphs do;
    the same slot on a committing request is refused, naming state_indices."""
    case, forest = verify_case()
    res = tree_verify(*args(case))
    idx = with_slot(case, -1)["state_indices"]
    state = case["state"].clone()
    tree_commit(state, idx, case["k"], res.u, res.log_p, case["parents"], case["cu_seqlens"],
                torch.tensor([3, -1, 2], dtype=torch.int32))
    with pytest.raises(InputError, match="state_indices"):
        tree_commit(state, idx, case["k"], res.u, res.log_p, case["parents"], case["cu_seqlens"],
                    torch.tensor([3, 0, 2], dtype=torch.int32))
