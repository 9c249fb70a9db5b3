"""The replay commit (kernels/tree_commit_replay.py) against its float64 reference, and against
the sequential recurrence it must reproduce (docs/design.md §2 "Replay commit", §9).

CPU: Triton's interpreter, float32 arithmetic. The precision contract itself (tf32 verify,
float32-exact committed state) needs the GPU: tests/test_precision_contract.py.
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.limits import REPLAY_CONST_ROW_PATH, REPLAY_GATES_FIRST_PMAX
from bole_cli.kernels import tree_commit_replay
from bole_cli.kernels.reference import tree_commit_replay_ref, tree_verify_sequential_ref
from strided_pools import PAD, clone_strided, pad_of, state_of
from test_kernels import make_case, rel_err

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def random_accepted(sizes, seed):
    r = random.Random(seed)
    return torch.tensor([r.randint(-1, s - 1) if s else -1 for s in sizes], dtype=torch.int32)


def replay(case, accepted, **call):
    pool = case["state"].clone()
    tree_commit_replay(pool, case["state_indices"], case["k"], case["v"], case["g"], case["beta"],
                       case["parents"], case["cu_seqlens"], accepted, **call)
    return pool


def replay_ref(case, accepted):
    return tree_commit_replay_ref(case["state"], case["state_indices"], case["k"], case["v"], case["g"],
                                  case["beta"], case["parents"], case["cu_seqlens"], accepted)


def check(case, forest, accepted, tol=1e-6, **call):
    got, want = replay(case, accepted, **call), replay_ref(case, accepted)
    assert rel_err(got, want) <= tol
    for b, a in enumerate(accepted.tolist()):  # a request that accepts nothing keeps its slot bit for bit
        if a < 0:
            slot = int(case["state_indices"][b])
            assert torch.equal(got[slot], case["state"][slot])
    used = set(case["state_indices"].tolist())
    for slot in range(case["state"].shape[0]):  # no write outside the committing slots
        if slot not in used:
            assert torch.equal(got[slot], case["state"][slot])


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
       group=st.sampled_from([1, 2, 4]), decay=st.sampled_from([(-1e-4, -1e-6), (-2.0, -0.01), (-30.0, -1e-4)]),
       shape=st.sampled_from(["any", "chain", "wide", "roots"]), bv=st.sampled_from([4, 8, 16, 32]),
       warps=st.sampled_from([1, 2, 4]))
@example(seed=1, sizes=[256], group=2, decay=(-30.0, -1e-4), shape="chain", bv=8, warps=1)
@example(seed=2, sizes=[256, 3], group=4, decay=(-1e-4, -1e-6), shape="any", bv=32, warps=4)
@example(seed=3, sizes=[200], group=1, decay=(-2.0, -0.01), shape="wide", bv=16, warps=2)
def test_replay_matches_reference(seed, sizes, group, decay, shape, bv, warps):
    """Random forests (deep chains, wide trees, several roots), GQA 1/2/4, decays near zero
    and near -30, value tiles narrower and wider than V, on 1-4 warps."""
    case, forest = make_case(seed, sizes, h=2, group=group, kdim=16, vdim=24, decay=decay, shape=shape)
    check(case, forest, random_accepted(forest.sizes, seed), config={"BV": bv, "num_warps": warps})


def test_replay_keeps_the_max_nodes_promise():
    """max_nodes sizes the walk: a request whose accepted node lies past the promise keeps
    its slot bit for bit (no partial path is committed); the others commit exactly."""
    case, forest = make_case(8, [12, 30], h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01), shape="chain")
    accepted = torch.tensor([11, 20], dtype=torch.int32)
    got = replay(case, accepted, check_trees=False, max_nodes=16)
    want = replay_ref(case, torch.tensor([11, -1], dtype=torch.int32))
    assert torch.equal(got[int(case["state_indices"][1])], case["state"][int(case["state_indices"][1])])
    assert rel_err(got, want) <= 1e-6


@pytest.mark.parametrize("max_nodes", [8, 16, 32, REPLAY_GATES_FIRST_PMAX, 128])
def test_replay_gate_forms_agree(max_nodes):
    """Below REPLAY_GATES_FIRST_PMAX each node's gates come with its rows, from it the whole
    path's first: both replay the same paths exactly (a strong decay, so a gate paired with
    the wrong node shows)."""
    case, forest = make_case(21, [8, 5, 8], h=2, group=2, kdim=16, vdim=16, decay=(-3.0, -0.5), shape="any")
    check(case, forest, torch.tensor([7, 4, 5], dtype=torch.int32), max_nodes=max_nodes)


def slow_case(seed, sizes, **kw):
    """Chains under a slow decay and small gates: the pre-tree state survives a 130-node
    path, so a double write, a wrong start slot or layer, or a cut path shows."""
    case, forest = make_case(seed, sizes, h=2, group=2, kdim=16, vdim=16, decay=(-1e-3, -1e-6), shape="chain",
                             **kw)
    case["beta"] = case["beta"] * 0.05
    return case, forest


@pytest.mark.parametrize("max_depth", [None, 3, 200])
def test_long_paths_take_the_passes_kernel(monkeypatch, max_depth):
    """Paths past REPLAY_STEP_PATH nodes go to the passes kernel, in a second launch, unless
    a promise keeps every path within it; the node-by-node kernel takes the rest (paths of
    63 and 64 nodes, 65 and 66 the passes kernel). Either way each slot is committed exactly
    once: a broken max_depth promise (3) stays exact, the long paths then replayed node by
    node."""
    module = importlib.import_module("bole_cli.kernels.tree_commit_replay")
    from bole_cli.limits import REPLAY_STEP_PATH

    launches = []
    real = module.launch_passes
    monkeypatch.setattr(module, "launch_passes", lambda *a, **kw: launches.append(kw["shortest"]) or real(*a, **kw))
    case, forest = slow_case(13, [130, 5, 70, 9, 63, 64, 65, 66])
    accepted = torch.tensor([129, 4, 69, 3, 62, 63, 64, 65], dtype=torch.int32)
    check(case, forest, accepted, max_depth=max_depth)
    assert launches == ([] if max_depth == 3 else [REPLAY_STEP_PATH])


@pytest.mark.parametrize("gated", [False, True])
def test_long_paths_with_a_layer_dimension(gated):
    """Both kernels over two layers in one launch each, plain and with the gates fused: a
    70-node path (the passes kernel) beside a short one."""
    from bole_cli.kernels import tree_commit_replay_gated
    from bole_cli.kernels.reference import gdn_gates_ref

    cases = [slow_case(30 + l, [70, 6])[0] for l in range(2)]
    st = {x: torch.stack([c[x] for c in cases]) for x in ("k", "v", "g", "beta", "state")}
    common = cases[0]
    accepted = torch.tensor([69, 5], dtype=torch.int32)
    tree = (common["parents"], common["cu_seqlens"], accepted)
    pool = st["state"].clone()
    if gated:
        gen = torch.Generator().manual_seed(3)
        a, b = (torch.randn(2, *common["g"].shape, generator=gen) for _ in range(2))
        b = b - 3.0  # beta = sigmoid(b) small: the pre-tree state survives the path
        A_log, dt_bias = torch.rand(2, a.shape[-1], generator=gen) - 6.0, torch.randn(2, a.shape[-1], generator=gen)
        gates = [gdn_gates_ref(A_log[l], a[l], dt_bias[l], b[l]) for l in range(2)]
        st["g"], st["beta"] = torch.stack([x[0] for x in gates]), torch.stack([x[1] for x in gates])
        tree_commit_replay_gated(pool, common["state_indices"], st["k"], st["v"], a, b, A_log, dt_bias, *tree)
    else:
        tree_commit_replay(pool, common["state_indices"], st["k"], st["v"], st["g"], st["beta"], *tree)
    want = tree_commit_replay_ref(st["state"], common["state_indices"], st["k"], st["v"], st["g"], st["beta"], *tree)
    assert rel_err(pool, want) <= 1e-6


def test_long_paths_keep_the_max_nodes_promise():
    """Past one launch too, an accepted node past the walk (max_nodes 65: 128 parents) leaves
    its slot bit for bit, though its path (101 nodes: a chain of 100, then node 149 below its
    end) would fit the walk; a 101-node path inside the walk is committed by the passes kernel."""
    case, forest = slow_case(16, [150, 110, 12])
    case["parents"][100:150] = 99  # request 0: nodes 100-149 are children of the chain's end
    accepted = torch.tensor([149, 100, 11], dtype=torch.int32)
    got = replay(case, accepted, check_trees=False, max_nodes=65)
    slot = int(case["state_indices"][0])
    assert torch.equal(got[slot], case["state"][slot])
    assert rel_err(got, replay_ref(case, torch.tensor([-1, 100, 11], dtype=torch.int32))) <= 1e-6


def test_short_trees_take_one_launch(monkeypatch):
    """Trees within REPLAY_STEP_PATH nodes (max_nodes, or the forest itself) never launch
    the passes kernel."""
    module = importlib.import_module("bole_cli.kernels.tree_commit_replay")

    monkeypatch.setattr(module, "launch_passes", lambda *a, **kw: pytest.fail("passes kernel launched"))
    case, forest = make_case(14, [64, 20, 33], h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01), shape="any")
    check(case, forest, random_accepted(forest.sizes, 14), max_nodes=64)
    small, forest = make_case(15, [10, 20], h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01), shape="chain")
    check(small, forest, torch.tensor([9, 19], dtype=torch.int32))


@pytest.mark.parametrize("layout", ["padded", "heads-inner"])
@pytest.mark.parametrize("sizes", [[9, REPLAY_CONST_ROW_PATH - 2, 5], [9, REPLAY_CONST_ROW_PATH + 8, 5]])
@pytest.mark.parametrize("layers", [1, 2])
def test_replay_in_a_pool_of_another_row_stride(layout, sizes, layers):
    """A pool whose rows are not K apart: paths within REPLAY_CONST_ROW_PATH nodes (the row
    stride a compile-time constant) and longer ones (an argument) commit the reference's state,
    one layer or two in one launch; the padded pool's gaps stay NaN."""
    cases = [make_case(40 + l, sizes, h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01), shape="chain")[0]
             for l in range(layers)]
    stack = {x: torch.stack([c[x] for c in cases]) if layers > 1 else cases[0][x]
             for x in ("k", "v", "g", "beta", "state")}
    common = cases[0]
    accepted = torch.tensor([s - 1 for s in sizes], dtype=torch.int32)  # the deepest node of each
    tree = (common["parents"], common["cu_seqlens"], accepted)
    pool = clone_strided(state_of(stack["state"], layout))
    tree_commit_replay(pool, common["state_indices"], stack["k"], stack["v"], stack["g"], stack["beta"], *tree,
                       max_nodes=max(sizes))
    want = tree_commit_replay_ref(stack["state"], common["state_indices"], stack["k"], stack["v"], stack["g"],
                                  stack["beta"], *tree)
    assert rel_err(pool, want) <= 1e-6
    if layout == "padded":
        assert pad_of(pool).isnan().all()


@pytest.mark.parametrize("sizes, max_depth, constant", [
    ([9, REPLAY_CONST_ROW_PATH, 5], None, True), ([9, REPLAY_CONST_ROW_PATH + 1, 5], None, False),
    ([9, REPLAY_CONST_ROW_PATH + 8, 5], REPLAY_CONST_ROW_PATH - 1, True),
    ([9, REPLAY_CONST_ROW_PATH + 8, 5], REPLAY_CONST_ROW_PATH, False)])
def test_short_paths_take_the_row_stride_as_a_constant(monkeypatch, sizes, max_depth, constant):
    """The launch passes the state's row stride as a compile-time constant when no promised
    path exceeds REPLAY_CONST_ROW_PATH nodes (max_nodes, or max_depth + 1), else 0 (the stride
    an argument)."""
    module = importlib.import_module("bole_cli.kernels.tree_commit_replay")
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(kw["SV"])

    monkeypatch.setattr(module, "_tree_commit_replay_kernel", Recorder())
    case, _ = make_case(5, sizes, h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01))
    pool = state_of(case["state"], "padded")
    tree_commit_replay(pool, case["state_indices"], case["k"], case["v"], case["g"], case["beta"],
                       case["parents"], case["cu_seqlens"], torch.zeros(len(sizes), dtype=torch.int32),
                       max_nodes=max(sizes), max_depth=max_depth)
    assert seen == [pool.stride(2) if constant else 0] and pool.stride(2) == 16 + PAD


def test_replay_equals_the_sequential_recurrence():
    """The committed state is the sequential recurrence's state at the accepted node: the
    float64 reference of the verify (a state per node) agrees with the replay."""
    case, forest = make_case(7, [9, 30, 5], h=2, group=2, kdim=16, vdim=16, decay=(-3.0, -0.01))
    accepted = torch.tensor([8, 17, 0], dtype=torch.int32)
    _, states = tree_verify_sequential_ref(*(case[x] for x in ("q", "k", "v", "g", "beta", "state",
                                                               "state_indices", "parents", "cu_seqlens")))
    got = replay(case, accepted)
    offsets = case["cu_seqlens"].tolist()
    for b, a in enumerate(accepted.tolist()):
        slot = int(case["state_indices"][b])
        assert rel_err(got[slot], states[offsets[b] + a]) <= 1e-6


def test_replay_all_layers_in_one_launch():
    cases = [make_case(11 + l, [6, 19], h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01))[0] for l in range(3)]
    stack = {x: torch.stack([c[x] for c in cases]) for x in ("k", "v", "g", "beta", "state")}
    common = cases[0]
    accepted = torch.tensor([5, 11], dtype=torch.int32)
    pool = stack["state"].clone()
    tree_commit_replay(pool, common["state_indices"], stack["k"], stack["v"], stack["g"], stack["beta"],
                       common["parents"], common["cu_seqlens"], accepted)
    want = tree_commit_replay_ref(stack["state"], common["state_indices"], stack["k"], stack["v"], stack["g"],
                                  stack["beta"], common["parents"], common["cu_seqlens"], accepted)
    assert rel_err(pool, want) <= 1e-6


@pytest.mark.parametrize("dtype,state_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float16, torch.float32)])
def test_replay_low_precision(dtype, state_dtype):
    """16-bit activations (and gates) and a bf16 pool: float32 arithmetic on the rounded
    inputs, the state rounded once (the reference does the same)."""
    case, forest = make_case(5, [12, 40], h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01),
                             dtype=dtype, state_dtype=state_dtype)
    case["g"], case["beta"] = case["g"].to(dtype), case["beta"].to(dtype)
    tol = 1e-6 if state_dtype == torch.float32 else 8e-3
    check(case, forest, torch.tensor([11, 39], dtype=torch.int32), tol=tol)


def test_replay_without_l2norm():
    case, forest = make_case(6, [10], h=1, group=2, kdim=16, vdim=16, decay=(-1.0, -0.01))
    case["k"] = case["k"] * 0.2
    accepted = torch.tensor([9], dtype=torch.int32)
    got = replay(case, accepted, use_qk_l2norm=False)
    want = tree_commit_replay_ref(*(case[x] for x in ("state", "state_indices", "k", "v", "g", "beta",
                                                      "parents", "cu_seqlens")), accepted, use_qk_l2norm=False)
    assert rel_err(got, want) <= 1e-6


def test_replay_skips_faults_without_checks():
    """Without check_trees (CUDA graphs): a slot outside the pool, an accepted node outside
    its tree and accepted -1 leave every slot untouched; the other requests commit exactly."""
    case, forest = make_case(9, [6, 8, 5, 7], h=2, group=2, kdim=16, vdim=16, decay=(-2.0, -0.01))
    case["state_indices"][0] = 10**6
    case["state_indices"][1] = -5
    accepted = torch.tensor([3, 2, 9, 6], dtype=torch.int32)  # request 2 accepts node 9 of 5
    got = replay(case, accepted, check_trees=False)
    want = replay_ref(case, torch.tensor([-1, -1, -1, 6], dtype=torch.int32))
    others = [s for s in range(got.shape[0]) if s != int(case["state_indices"][3])]
    assert torch.equal(got[others], case["state"][others])
    assert rel_err(got, want) <= 1e-6


def test_replay_errors_name_the_argument():
    case, forest = make_case(2, [4, 4], h=2, group=2, kdim=16, vdim=16, decay=(-1.0, -0.01))
    acc = torch.tensor([1, 2], dtype=torch.int32)
    base = [case[x] for x in ("state", "state_indices", "k", "v", "g", "beta", "parents", "cu_seqlens")]
    with pytest.raises(InputError, match=r"^v: "):
        tree_commit_replay(*base[:3], case["v"][:, :1], *base[4:], acc)
    with pytest.raises(InputError, match=r"^g: "):
        tree_commit_replay(*base[:4], case["g"].to(torch.int32), *base[5:], acc)
    with pytest.raises(InputError, match=r"^beta: "):
        tree_commit_replay(*base[:5], case["beta"][:-1], *base[6:], acc)
    same = case["state_indices"].clone()
    same[1] = same[0]
    with pytest.raises(InputError, match=r"^state_indices: requests 0 and 1 both commit"):
        tree_commit_replay(base[0], same, *base[2:], acc)
    with pytest.raises(InputError, match=r"^config: BV must be a power of two"):
        tree_commit_replay(*base, acc, config={"BV": 3})
    with pytest.raises(InputError, match=r"^max_depth: expected an int in 0\.\.255"):
        tree_commit_replay(*base, acc, max_depth=-1)
    with pytest.raises(InputError, match=r"^config: unknown keys \['DP'\]"):
        tree_commit_replay(*base, acc, config={"DP": 16})


@pytest.mark.gpu
@pytest.mark.parametrize("sizes,shape,max_nodes", [([64] * 16, "any", None), ([256, 256], "chain", None),
                                                   ([256, 100, 3], "wide", None), ([16] * 16, "any", 16),
                                                   ([REPLAY_CONST_ROW_PATH] * 8, "chain", REPLAY_CONST_ROW_PATH)])
def test_gpu_replay_real_shapes(sizes, shape, max_nodes):
    """The 9B GDN shape (H 16, HV 32, K = V = 128), bf16 inputs, on the GPU: float32
    elementwise arithmetic stays within 1e-6 of float64 (no tf32 on this path); with
    max_nodes within REPLAY_CONST_ROW_PATH, the row stride a compile-time constant."""
    case, forest = make_case(3, sizes, h=16, group=2, kdim=128, vdim=128, decay=(-3.0, -1e-4),
                             dtype=torch.bfloat16, device="cuda", shape=shape)
    accepted = random_accepted(forest.sizes, 3).cuda()
    got = replay(case, accepted, check_trees=False, max_nodes=max_nodes)
    want = replay_ref({x: t.double() if t.is_floating_point() and x != "state" else t for x, t in case.items()},
                      accepted)
    assert rel_err(got, want) <= 1e-6


@pytest.mark.parametrize("size", [9, 40, 130])
def test_replay_deep_chains_with_correlated_keys(size):
    """Consecutive keys with cosine ~0.9 and beta 1 (I + G's powers grow like path counts,
    which lost every digit of a 64-node chain's solve in product form; docs/design.md §2
    "The solve"): the node-by-node replay stays at float32."""
    case, forest = make_case(4, [size], h=1, group=1, kdim=32, vdim=16, decay=(-0.01, -1e-4), shape="chain")
    k = case["k"]
    k[:] = 0.8 * k[0] / k[0].norm() * 5.6 + 0.2 * k
    case["beta"][:] = 1.0
    check(case, forest, torch.tensor([size - 1], dtype=torch.int32), tol=1e-5)


@pytest.mark.parametrize("max_nodes", [None, REPLAY_GATES_FIRST_PMAX])
@pytest.mark.parametrize("layers", [None, 2])
def test_gated_replay_matches_the_gates_reference(layers, max_nodes):
    """tree_commit_replay_gated (SGLang's raw a, b and A_log, dt_bias, per layer with a layer
    dimension) against the reference on gdn_gates_ref's g and beta; each node's gates with
    its rows (a 32-node walk) and the whole path's first (a walk of REPLAY_GATES_FIRST_PMAX)."""
    from bole_cli.kernels import tree_commit_replay_gated
    from bole_cli.kernels.reference import gdn_gates_ref

    case, forest = make_case(12, [7, 20], h=2, group=2, kdim=16, vdim=16, decay=(-1.0, -0.01),
                             dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    n, hv = case["g"].shape
    count = layers or 1
    a, b = (torch.randn(count, n, hv, generator=gen).to(torch.bfloat16) for _ in range(2))
    A_log, dt_bias = torch.rand(count, hv, generator=gen) - 0.5, torch.randn(count, hv, generator=gen)
    gates = [gdn_gates_ref(A_log[l], a[l], dt_bias[l], b[l]) for l in range(count)]
    g, beta = torch.stack([x[0] for x in gates]), torch.stack([x[1] for x in gates])
    state = torch.stack([case["state"]] * count)
    k, v = torch.stack([case["k"]] * count), torch.stack([case["v"]] * count)
    accepted = torch.tensor([6, 13], dtype=torch.int32)
    if layers is None:
        state, k, v, a, b, A_log, dt_bias, g, beta = (t[0] for t in (state, k, v, a, b, A_log, dt_bias, g, beta))
    pool = state.clone()
    tree_commit_replay_gated(pool, case["state_indices"], k, v, a, b, A_log, dt_bias, case["parents"],
                             case["cu_seqlens"], accepted, max_nodes=max_nodes)
    want = tree_commit_replay_ref(state, case["state_indices"], k, v, g, beta, case["parents"], case["cu_seqlens"],
                                  accepted)
    assert rel_err(pool, want) <= 1e-6
    # Strided views (a column slice of a wider tensor, every other element) are read as the
    # values they show: the kernel reads both with one layer stride, A_log's.
    wide_A, wide_dt = (torch.cat([t, torch.full_like(t, 7.0)], dim=-1) for t in (A_log, dt_bias))
    for A_view, dt_view in ((A_log, wide_dt[..., :hv]), (wide_A[..., :hv], dt_bias),
                            (torch.stack([A_log, A_log], -1)[..., 0], dt_bias)):
        pool = state.clone()
        tree_commit_replay_gated(pool, case["state_indices"], k, v, a, b, A_view, dt_view, case["parents"],
                                 case["cu_seqlens"], accepted, max_nodes=max_nodes)
        assert rel_err(pool, want) <= 1e-6
    with pytest.raises(InputError, match=r"^dt_bias: "):
        tree_commit_replay_gated(pool, case["state_indices"], k, v, a, b, A_log, dt_bias[..., :1],
                                 case["parents"], case["cu_seqlens"], accepted)
