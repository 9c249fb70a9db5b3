"""Proposal trees: validation messages, queries against brute force, packing, SGLang
round trips, file I/O and the generators."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bole_cli.trees
from bole_cli.errors import InputError
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.trees import (
    Forest,
    ProposalTree,
    beam_tree,
    beam_tree_size,
    chain_tree,
    dump_trees,
    from_sglang,
    load_sglang,
    load_trees,
    pack_forest,
    parse_trees,
    random_forest,
    random_tree,
    retrieve_parent_token,
    to_sglang,
)
from bole_cli.trees.forest import check_batch, pack_segments
from bole_cli.trees.generators import grow_beam

DATA = Path(__file__).parent / "data" / "trees"


# ---- strategies -------------------------------------------------------------------------------

@st.composite
def parent_lists(draw, min_size=1, max_size=40, single_root=False):
    n = draw(st.integers(min_size, max_size))
    parents = [-1]
    for i in range(1, n):
        low = 0 if single_root else -1
        parents.append(draw(st.integers(low, i - 1)))
    return parents


@st.composite
def trees(draw, min_size=1, max_size=40, single_root=False, log_probs=None):
    parents = draw(parent_lists(min_size, max_size, single_root))
    lp = log_probs if log_probs is not None else st.floats(-8.0, 0.0)
    return ProposalTree(parents, draw(st.lists(lp, min_size=len(parents), max_size=len(parents))))


def brute_ancestors(parents, i):
    """Ancestors by walking parents with no shortcuts (set semantics)."""
    out = set()
    p = parents[i]
    while p != -1:
        out.add(p)
        p = parents[p]
    return out


# ---- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("parents, log_probs, message", [
    ([], [], "tree is empty"),
    ([-1, 2, 1], [0.0, 0.0, 0.0], "node 1: parents form a cycle (1 -> 2 -> 1)"),
    ([-1, 1], [0.0, 0.0], "node 1: parents form a cycle (1 -> 1)"),
    ([1, 0], [0.0, 0.0], "node 0: parents form a cycle (0 -> 1 -> 0)"),
    ([-1, 0, 0, 1, 1, 7, 2, 3], [0.0] * 8, "node 5: parent 7 is not before it"),
    ([-1, 0, 9], [0.0] * 3, "node 2: parent 9 is out of range (-1 to 2)"),
    ([-1, -2], [0.0] * 2, "node 1: parent -2 is out of range"),
    ([-1, 0.5], [0.0] * 2, "node 1: parent 0.5 is not an integer"),
    ([-1, True], [0.0] * 2, "node 1: parent True is not an integer"),
    ([-1, 0, 0], [0.0, float("nan"), -1.0], "node 1: log-prob is NaN"),
    ([-1, 0, 0], [0.0, -1.0, 0.25], "node 2: log-prob 0.25 is positive"),
    ([-1, 0], [0.0, -math.inf], "node 1: log-prob is -inf (probability 0)"),
    ([-1, 0], [0.0], "'log_probs' has 1 entries but 'parents' has 2"),
    ([-1] * (MAX_TREE_NODES + 1), [0.0] * (MAX_TREE_NODES + 1), "at most 256"),
])
def test_validation_messages(parents, log_probs, message):
    with pytest.raises(InputError) as info:
        ProposalTree(parents, log_probs)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("probs, message", [
    ([1.0, 1.5], "node 1: probability 1.5 is outside (0, 1]"),
    ([1.0, 0.0], "node 1: probability 0 is outside (0, 1]"),
    ([1.0, -0.1], "node 1: probability -0.1 is outside (0, 1]"),
    ([float("nan"), 0.5], "node 0: probability is NaN"),
    ([1.0, "x"], "node 1: probability 'x' is not a number"),
])
def test_probability_messages(probs, message):
    with pytest.raises(InputError, match=None) as info:
        ProposalTree.from_probs([-1, 0], probs)
    assert message in str(info.value)


def test_tokens_validated():
    with pytest.raises(InputError, match="node 1: token 1.5 must be an id"):
        ProposalTree([-1, 0], [0.0, 0.0], [3, 1.5])
    with pytest.raises(InputError, match="'tokens' has 1 entries"):
        ProposalTree([-1, 0], [0.0, 0.0], ["a"])
    assert ProposalTree([-1, 0], [0.0, 0.0], [3, " x"]).tokens == (3, " x")


def test_max_nodes_accepted_exactly():
    assert len(chain_tree(MAX_TREE_NODES)) == MAX_TREE_NODES


# ---- queries against brute force --------------------------------------------------------------

@settings(max_examples=60)
@given(trees())
def test_queries_match_brute_force(t):
    n = t.n_nodes
    mask = t.ancestor_mask()
    strict = t.ancestor_mask(include_self=False)
    for i in range(n):
        anc = brute_ancestors(t.parents, i)
        assert set(t.ancestors(i)) == anc
        assert list(t.ancestors(i)) == sorted(anc)  # root first = ascending index
        assert t.path(i)[-1] == i
        assert t.depths[i] == len(anc) + 1
        assert math.isclose(t.log_rho[i], sum(t.log_probs[j] for j in anc | {i}),
                            rel_tol=1e-12, abs_tol=1e-12)
        assert [j for j in range(n) if mask[i][j]] == sorted(anc | {i})
        assert [j for j in range(n) if strict[i][j]] == sorted(anc)
        assert t.log_rho[i] <= (t.log_rho[t.parents[i]] if t.parents[i] >= 0 else 0.0)
    assert t.depth == max(t.depths)
    assert sum(t.widths) == n
    assert all(w == sum(1 for d in t.depths if d == k + 1) for k, w in enumerate(t.widths))
    assert set(t.roots) == {i for i in range(n) if t.parents[i] == -1}
    assert math.isclose(t.expected_accepted(), sum(math.exp(x) for x in t.log_rho))


def test_small_tree_queries():
    t = ProposalTree.from_probs([-1, 0, 0, 1, 1, 2, 3], [1.0, 0.6, 0.3, 0.5, 0.4, 0.9, 0.8])
    assert t.depths == (1, 2, 2, 3, 3, 3, 4)
    assert t.depth == 4
    assert t.widths == (1, 2, 3, 1)
    assert t.ancestors(6) == (0, 1, 3)
    assert t.children[1] == (3, 4)
    assert t.rho[6] == pytest.approx(0.6 * 0.5 * 0.8)
    assert t.best_path() == (0, 1, 3, 6)


def test_ancestor_mask_tensor():
    torch = pytest.importorskip("torch")
    t = ProposalTree([-1, 0, 0, 2], [0.0] * 4)
    m = t.ancestor_mask_tensor()
    assert m.dtype == torch.bool and tuple(m.shape) == (4, 4)
    assert m.tolist() == t.ancestor_mask()


def test_induced_subtree_renumbers_and_rejects_orphans():
    t = ProposalTree([-1, 0, 0, 2, 3], [0.0, -1.0, -0.5, -0.1, -0.2], ["a", "b", "c", "d", "e"])
    sub, ids = t.induced([0, 2, 3])
    assert ids == (0, 2, 3)
    assert sub.parents == (-1, 0, 1)
    assert sub.tokens == ("a", "c", "d")
    with pytest.raises(InputError, match="node 4: parent 3 is not selected"):
        t.induced([0, 4])


# ---- packing -----------------------------------------------------------------------------------

def test_pack_forest_offsets():
    a = chain_tree(3)
    b = ProposalTree([-1, -1, 0, 1], [0.0] * 4)
    c = ProposalTree([-1], [0.0])
    f = pack_forest([a, b, c])
    assert f.cu_seqlens == (0, 3, 7, 8)
    assert f.parents == (-1, 0, 1, -1, -1, 0, 1, -1)  # parents stay local
    assert f.depths == (1, 2, 3, 1, 1, 2, 2, 1)
    assert f.sizes == (3, 4, 1) and f.batch_size == 3 and f.n_nodes == 8
    assert f.tree(1) == b
    assert f.parents[f.request(1)] == b.parents


def test_pack_forest_to_torch():
    torch = pytest.importorskip("torch")
    f = pack_forest([chain_tree(2), chain_tree(3)])
    parents, cu = f.to_torch("cpu")
    assert parents.dtype == torch.int32 and cu.dtype == torch.int32
    assert parents.tolist() == [-1, 0, -1, 0, 1] and cu.tolist() == [0, 2, 5]


@settings(max_examples=30)
@given(st.lists(trees(max_size=20), min_size=1, max_size=6))
def test_pack_forest_round_trips(ts):
    f = pack_forest(ts)
    assert f.cu_seqlens[0] == 0 and len(f.cu_seqlens) == len(ts) + 1
    for b, t in enumerate(ts):
        assert f.cu_seqlens[b + 1] - f.cu_seqlens[b] == t.n_nodes
        assert f.tree(b) == ProposalTree(t.parents, t.log_probs)


def test_pack_forest_empty_batch():
    with pytest.raises(InputError, match="batch is empty"):
        pack_forest([])


# ---- SGLang ---------------------------------------------------------------------------------------

def test_sglang_known_arrays():
    # node 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}; siblings ascending as SGLang builds them
    nt = [1, 3, 5, -1, -1, -1]
    ns = [-1, 2, -1, 4, -1, -1]
    assert retrieve_parent_token(nt, ns) == [-1, 0, 0, 1, 1, 2]
    t = from_sglang(nt, ns, probs=[0.6, 0.3, 0.5, 0.4, 0.9])
    assert t.parents == (-1, 0, 0, 1, 1, 2)
    assert t.log_probs[0] == 0.0 and t.probs[1] == pytest.approx(0.6)
    assert to_sglang(t) == (nt, ns)


@settings(max_examples=60)
@given(trees(single_root=True))
def test_sglang_round_trip_tree(t):
    arrays = to_sglang(t)
    assert retrieve_parent_token(*arrays) == list(t.parents)
    assert from_sglang(*arrays, t.log_probs, tokens=t.tokens) == t


@settings(max_examples=60)
@given(trees(single_root=True), st.randoms(use_true_random=False))
def test_sglang_round_trip_arrays_any_sibling_order(t, rnd):
    # arrays with siblings linked in a shuffled order still give the same parents,
    # and the canonical (SGLang) order survives arrays -> tree -> arrays exactly
    nt, ns = [-1] * len(t), [-1] * len(t)
    for p, kids in enumerate(t.children):
        kids = list(kids)
        rnd.shuffle(kids)
        if kids:
            nt[p] = kids[0]
            for a, b in zip(kids, kids[1:]):
                ns[a] = b
    assert retrieve_parent_token(nt, ns) == list(t.parents)
    canonical = to_sglang(t)
    assert to_sglang(from_sglang(*canonical)) == canonical


@pytest.mark.parametrize("nt, ns, message", [
    ([2, -1, 1], [-1, -1, -1], "node 1: parent 2 is not before it"),
    ([1, -1, -1], [-1, -1, -1], "node 2: not reachable from node 0"),
    ([1, 2, -1], [-1, 2, -1], "node 2: reached twice"),
    ([1, -1], [-1, 1], "node 1: reached twice"),
    ([1, -1], [1, -1], "retrive_next_sibling[0]"),
    ([5, -1], [-1, -1], "retrive_next_token[0]: 5 is out of range"),
    ([], [], "tree is empty"),
    ([1, -1], [-1], "'retrive_next_sibling' has 1 entries"),
])
def test_sglang_rejects_bad_links(nt, ns, message):
    with pytest.raises(InputError) as info:
        from_sglang(nt, ns)
    assert message in str(info.value)


def test_to_sglang_needs_single_root_at_zero():
    with pytest.raises(InputError, match="node 2: SGLang trees have a single root"):
        to_sglang(ProposalTree([-1, 0, -1], [0.0] * 3))


def test_from_sglang_score_lengths():
    with pytest.raises(InputError, match="'log_probs' has 1 entries; expected 3"):
        from_sglang([1, 2, -1], [-1, -1, -1], [0.0])
    with pytest.raises(InputError, match="either 'probs' or 'log_probs'"):
        from_sglang([1, -1], [-1, -1], [0.0, 0.0], probs=[1.0, 1.0])
    assert from_sglang([1, -1], [-1, -1]).log_probs == (0.0, 0.0)


def test_from_sglang_accepts_tensors():
    torch = pytest.importorskip("torch")
    nt = torch.tensor([1, -1, -1])
    ns = torch.tensor([-1, 2, -1])
    assert from_sglang(nt, ns).parents == (-1, 0, 0)


# ---- files ------------------------------------------------------------------------------------------

def test_load_yaml_with_probs_and_string_tokens():
    (t,) = load_trees(DATA / "small.yaml")
    assert t.parents == (-1, 0, 0, 1, 1, 2, 3)
    assert t.tokens[1] == " cat"
    assert t.probs[5] == pytest.approx(0.9)


def test_load_json_batch():
    ts = load_trees(DATA / "batch.json")
    assert [len(t) for t in ts] == [5, 5, 6]
    assert ts[0].tokens == (101, 2054, 2003, 1037, 3899)
    assert ts[1].roots == (0, 1)


def test_load_sglang_files():
    (t,) = load_sglang(DATA / "sglang.json")
    assert t.parents == (-1, 0, 0, 1, 1, 2) and t.tokens == (42, 7, 9, 11, 13, 15)
    a, b = load_sglang(DATA / "sglang_batch.yaml")
    assert a.parents == (-1, 0, 1, 0) and b.parents == (-1, 0, 0, 0)


@pytest.mark.parametrize("name, message", [
    ("bad_cycle.json", "bad_cycle.json: node 1: parents form a cycle (1 -> 2 -> 1)"),
    ("bad_order.json", "node 5: parent 7 is not before it"),
    ("bad_dangling.json", "node 2: parent 9 is out of range"),
    ("bad_prob.json", "node 1: probability 1.5 is outside (0, 1]"),
    ("bad_prob_zero.json", "node 2: probability 0 is outside (0, 1]"),
    ("bad_nan.json", "node 1: log-prob is NaN"),
    ("bad_empty.json", "tree is empty"),
    ("missing.json", "missing.json: file not found"),
])
def test_bad_files(name, message):
    with pytest.raises(InputError) as info:
        load_trees(DATA / name)
    assert message in str(info.value)


def test_bad_sglang_file():
    with pytest.raises(InputError, match="node 1: parent 2 is not before it"):
        load_sglang(DATA / "bad_sglang_order.json")


@pytest.mark.parametrize("data, message", [
    ({"parents": [-1]}, "missing field 'probs' or 'log_probs'"),
    ({"probs": [1.0]}, "missing field 'parents'"),
    ({"parents": [-1], "probs": [1.0], "log_probs": [0.0]}, "either 'probs' or 'log_probs'"),
    ({"parents": [-1], "probs": [1.0], "colour": 1}, "unknown field 'colour'"),
    ({"retrive_next_token": [-1]}, "use --sglang"),
    ([{"parents": [-1], "probs": [1.0]}, {"parents": [-1, 3], "probs": [1.0, 1.0]}],
     "x: tree 1: node 1: parent 3 is out of range"),
    ([], "the list of trees is empty"),
    ("text", "expected a tree (mapping) or a list of trees"),
    ({"parents": "abc", "probs": [1.0]}, "'parents' must be a list"),
])
def test_parse_errors_name_the_field(data, message):
    with pytest.raises(InputError) as info:
        parse_trees(data, "x")
    assert message in str(info.value)


def test_invalid_json_and_yaml(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.yaml").write_text("parents: [1, 2\n")
    with pytest.raises(InputError, match="a.json: not valid JSON"):
        load_trees(tmp_path / "a.json")
    with pytest.raises(InputError, match="b.yaml: not valid YAML"):
        load_trees(tmp_path / "b.yaml")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@settings(max_examples=15)
@given(ts=st.lists(trees(max_size=12), min_size=1, max_size=3))
def test_dump_load_round_trip(tmp_path_factory, suffix, ts):
    path = tmp_path_factory.mktemp("dump") / f"trees{suffix}"
    dump_trees(path, ts)
    assert load_trees(path) == ts
    dump_trees(path, ts[0])
    assert load_trees(path) == [ts[0]]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_dump_keeps_awkward_tokens(tmp_path, suffix):
    tokens = [" the", "yes", "1", "null", "\n", "'\"", "", 0, "é€"]
    t = ProposalTree([-1] + list(range(len(tokens) - 1)), [0.0] * len(tokens), tokens)
    assert load_trees(dump_trees(tmp_path / f"t{suffix}", t)) == [t]


def test_dump_with_probs_and_tokens(tmp_path):
    t = ProposalTree.from_probs([-1, 0], [1.0, 0.5], ["a", 7])
    path = dump_trees(tmp_path / "t.json", t, use_probs=True)
    data = json.loads(path.read_text())
    assert data == {"parents": [-1, 0], "probs": [1.0, 0.5], "tokens": ["a", 7]}
    (back,) = load_trees(path)
    assert back.parents == t.parents and back.tokens == t.tokens
    assert back.probs == pytest.approx(t.probs)


# ---- generators -------------------------------------------------------------------------------------

def test_chain_tree():
    t = chain_tree(5, prob=0.5)
    assert t.parents == (-1, 0, 1, 2, 3) and t.depth == 5
    assert t.rho[-1] == pytest.approx(0.5 ** 5)


@pytest.mark.parametrize("depth, topk", [(1, 1), (1, 4), (3, 2), (8, 4), (2, 10)])
def test_beam_tree_shape(depth, topk):
    t = beam_tree(depth, topk, seed=1)
    assert len(t) == beam_tree_size(depth, topk)
    assert t.roots == (0,) and t.log_probs[0] == 0.0
    assert t.depth == depth + 1
    assert t.widths == (1, topk) + (topk * topk,) * (depth - 1)
    # only the top-k nodes of each level (by rho) have children, topk each
    for level in range(2, depth + 1):
        nodes = [i for i in range(len(t)) if t.depths[i] == level]
        expanded = [i for i in nodes if t.children[i]]
        best = sorted(nodes, key=lambda i: (-t.log_rho[i], i))[:topk]
        assert sorted(expanded) == sorted(best)
        assert all(len(t.children[i]) == topk for i in expanded)
    to_sglang(t)  # SGLang-shaped


def test_beam_tree_deterministic_and_seeded():
    assert beam_tree(4, 3, seed=7) == beam_tree(4, 3, seed=7)
    assert beam_tree(4, 3, seed=7) != beam_tree(4, 3, seed=8)
    assert beam_tree(4, 3, seed=random.Random(7)) == beam_tree(4, 3, seed=7)


def test_beam_tree_level_probs():
    t = beam_tree(2, 2, level_probs=[0.6, 0.3])
    assert t.probs[1:3] == pytest.approx((0.6, 0.3))
    assert t.probs[3:] == pytest.approx((0.6, 0.3, 0.6, 0.3))
    t = beam_tree(2, 2, level_probs=[[0.5, 0.5], [0.9, 0.1]])
    assert t.probs[3:] == pytest.approx((0.9, 0.1, 0.9, 0.1))
    with pytest.raises(InputError, match=r"level_probs\[0\]: probabilities sum to 1.2 > 1"):
        beam_tree(2, 2, level_probs=[0.6, 0.6])
    with pytest.raises(InputError, match="level_probs has 3 levels"):
        beam_tree(2, 2, level_probs=[[0.5, 0.5]] * 3)


def test_grow_beam_is_beam_tree_without_the_node_limit():
    """beam_tree is grow_beam under MAX_TREE_NODES; past it (SGLang's 5 steps, top-k 8:
    265 candidates) only grow_beam answers, as the observed-histogram fit needs."""
    q = [[0.5, 0.2, 0.1], [0.6, 0.3, 0.05], [0.4, 0.4, 0.1]]
    logs = [[math.log(p) for p in row] for row in q]
    parents, log_probs, log_rho = grow_beam(3, 3, logs.__getitem__)
    t = beam_tree(3, 3, level_probs=q)
    assert tuple(parents) == t.parents and tuple(log_probs) == t.log_probs
    assert tuple(log_rho) == t.log_rho
    row = [math.log(p) for p in (0.5, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01)]
    parents, _, _ = grow_beam(5, 8, lambda lvl: row)
    assert len(parents) == beam_tree_size(5, 8) == 265


@pytest.mark.parametrize("kwargs, message", [
    (dict(depth=0, topk=4), "depth must be a positive integer"),
    (dict(depth=8, topk=0), "topk must be a positive integer"),
    (dict(depth=8, topk=8), "gives 457 nodes; at most 256"),
])
def test_beam_tree_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        beam_tree(**kwargs)


def test_random_tree_nasty_shapes():
    chain = random_tree(1, 50, shape="chain")
    assert chain.depth == 50
    wide = random_tree(1, 50, shape="wide")
    assert wide.depth == 2 and wide.widths == (1, 49)
    flat = random_tree(1, 50, shape="roots")
    assert len(flat.roots) == 50
    multi = random_tree(1, 50, n_roots=4)
    assert len(multi.roots) == 4 and multi.roots[0] == 0
    assert random_tree(3, 256).n_nodes == 256


@settings(max_examples=40)
@given(st.integers(0, 2**32), st.integers(1, 80), st.integers(2, 10), st.integers(1, 5))
def test_random_tree_respects_limits(seed, n, max_depth, n_roots):
    n_roots = min(n_roots, n)
    t = random_tree(random.Random(seed), n, max_depth=max_depth, n_roots=n_roots)
    assert t.n_nodes == n and t.depth <= max_depth and len(t.roots) == n_roots
    assert all(lp <= 0.0 for lp in t.log_probs)


def test_random_trees_reach_deep_and_wide():
    rng = random.Random(0)
    ts = [random_tree(rng, 40) for _ in range(200)]
    assert max(t.depth for t in ts) >= 30  # near-chains appear
    assert min(t.depth for t in ts) <= 8  # and bushy trees


def test_random_forest_mixes_shapes():
    f = random_forest(5, [30] * 40)
    assert isinstance(f, Forest) and f.sizes == (30,) * 40
    depths = {f.tree(b).depth for b in range(40)}
    roots = {len(f.tree(b).roots) for b in range(40)}
    assert 30 in depths and 2 in depths and 1 in depths  # chain, wide, all roots
    assert len(roots) > 2
    assert random_forest(5, [30] * 40) == f


@settings(max_examples=30)
@given(st.integers(0, 2**32), st.lists(st.integers(1, 60), min_size=1, max_size=8),
       st.integers(1, 9))
def test_random_forest_respects_max_depth(seed, sizes, max_depth):
    f = random_forest(seed, sizes, max_depth=max_depth)
    assert f.sizes == tuple(sizes) and f.max_depth <= max_depth


def test_random_tree_errors():
    with pytest.raises(InputError, match="n_nodes must be 1 to 256"):
        random_tree(0, 0)
    with pytest.raises(InputError, match="shape 'star'"):
        random_tree(0, 5, shape="star")
    with pytest.raises(InputError, match="n_roots must be 1 to 5"):
        random_tree(0, 5, n_roots=6)
    with pytest.raises(InputError, match="shape 'chain' with 9 nodes does not fit max_depth 4"):
        random_tree(0, 9, max_depth=4, shape="chain")
    with pytest.raises(InputError, match="sizes is empty"):
        random_forest(0, [])


# ---- the package -----------------------------------------------------------------------------

def test_package_presents_its_public_api():
    import importlib

    for name in bole_cli.trees.__all__:
        assert getattr(bole_cli.trees, name) is not None, name
    # each public name has one home module inside the package
    homes = {name: getattr(bole_cli.trees, name).__module__ for name in bole_cli.trees.__all__
             if hasattr(getattr(bole_cli.trees, name), "__module__")}
    for name, home in homes.items():
        assert home.startswith("bole_cli.trees."), (name, home)
        assert getattr(importlib.import_module(home), name) is getattr(bole_cli.trees, name)


def test_pack_segments_keeps_empty_requests():
    a, b = ProposalTree([-1, 0], [0.0, -0.5]), chain_tree(3)
    f = pack_segments([a, None, b, None])
    assert f.cu_seqlens == (0, 2, 2, 5, 5) and f.sizes == (2, 0, 3, 0)
    assert f.tree(1) is None and f.tree(3) is None and f.tree(2) == b
    assert f.parents == (-1, 0, -1, 0, 1) and f.depths == (1, 2, 1, 2, 3)
    assert pack_segments([a, b]) == pack_forest([a, b])


def test_check_batch_rejects_non_trees():
    t = chain_tree(2)
    assert check_batch((t, t), "pack") == [t, t]
    with pytest.raises(InputError, match="batch is empty: no trees to select from"):
        check_batch([], "select from")
    with pytest.raises(TypeError, match="request 1: expected a ProposalTree, got list"):
        check_batch([t, [-1, 0]], "pack")
