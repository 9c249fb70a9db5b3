"""Batch-wide budget selection: properties (prefix-connected, within budget, order
invariant, N best) and the options and errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bole_cli.budget import best_first, expected_accepted_curve, select_budget
from bole_cli.errors import InputError
from bole_cli.trees import ProposalTree, beam_tree, chain_tree


@st.composite
def trees(draw, max_size=24, log_probs=st.floats(-6.0, 0.0)):
    n = draw(st.integers(1, max_size))
    parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
    return ProposalTree(parents, draw(st.lists(log_probs, min_size=n, max_size=n)))


batches = st.lists(trees(), min_size=1, max_size=5)
# few distinct values: ties on rho everywhere, including across requests
tied_batches = st.lists(trees(log_probs=st.sampled_from([0.0, -0.5, -1.0])), min_size=1,
                        max_size=5)


def kept_scores(ts, sel):
    return sorted((ts[b].log_rho[i] for b, ids in enumerate(sel.kept_ids) for i in ids),
                  reverse=True)


def assert_prefix_connected(ts, sel):
    for b, ids in enumerate(sel.kept_ids):
        kept = set(ids)
        for i in ids:
            p = ts[b].parents[i]
            assert p == -1 or p in kept, (b, i)


@settings(max_examples=60)
@given(batches.flatmap(lambda ts: st.tuples(st.just(ts), st.integers(len(ts), 80))))
def test_selection_properties(case):
    ts, budget = case
    sel = select_budget(ts, budget)
    total = sum(len(t) for t in ts)
    assert sel.n_kept == min(budget, total)  # never exceeds, and uses what it may
    assert_prefix_connected(ts, sel)
    assert all(len(ids) >= 1 for ids in sel.kept_ids)  # default minimum: one per request
    # the packed forest is the kept trees with local parents, in original order
    f = sel.forest
    assert f.batch_size == len(ts)
    for b, ids in enumerate(sel.kept_ids):
        assert list(ids) == sorted(ids)
        seg = f.parents[f.request(b)]
        assert len(seg) == len(ids)
        for j, i in enumerate(ids):
            p = ts[b].parents[i]
            assert seg[j] == (-1 if p == -1 else ids.index(p))
        assert math.isclose(sel.expected_accepted[b], ts[b].expected_accepted(ids))
        assert sel.expected_accepted[b] <= sel.expected_accepted_full[b] + 1e-12
    assert sel.original_ids == tuple(i for ids in sel.kept_ids for i in ids)


@settings(max_examples=60)
@given(batches.flatmap(lambda ts: st.tuples(st.just(ts), st.integers(1, 80))))
def test_keeps_the_n_best_scores(case):
    ts, budget = case
    sel = select_budget(ts, budget, min_per_request=0)
    every = sorted((lr for t in ts for lr in t.log_rho), reverse=True)
    assert kept_scores(ts, sel) == every[:budget]
    assert_prefix_connected(ts, sel)


@settings(max_examples=60)
@given(tied_batches.flatmap(lambda ts: st.tuples(st.just(ts), st.integers(1, 60))))
def test_ties_keep_n_best_and_stay_connected(case):
    ts, budget = case
    sel = select_budget(ts, budget, min_per_request=0)
    every = sorted((lr for t in ts for lr in t.log_rho), reverse=True)
    assert kept_scores(ts, sel) == every[:budget]
    assert_prefix_connected(ts, sel)
    # ties go to the earlier request, then the lower node index
    cut = every[budget - 1] if budget <= len(every) else -math.inf
    tied = [(b, i) for b, t in enumerate(ts) for i, lr in enumerate(t.log_rho) if lr == cut]
    kept_tied = [(b, i) for b, ids in enumerate(sel.kept_ids) for i in ids
                 if ts[b].log_rho[i] == cut]
    assert kept_tied == sorted(tied)[:len(kept_tied)]


def _primes(n):
    out, k = [], 2
    while len(out) < n:
        if all(k % p for p in out if p * p <= k):
            out.append(k)
        k += 1
    return out


@st.composite
def distinct_score_batches(draw):
    """Batches where no two nodes share a score: each node's log-prob is -sqrt(p)/10 for
    its own prime p, and sums of square roots of distinct primes never coincide."""
    shapes = draw(batches)
    total = sum(len(t) for t in shapes)
    primes = draw(st.permutations(_primes(total)))
    out, k = [], 0
    for t in shapes:
        out.append(ProposalTree(t.parents, [-math.sqrt(p) / 10 for p in primes[k:k + len(t)]]))
        k += len(t)
    return out


@settings(max_examples=60)
@given(distinct_score_batches().flatmap(
    lambda ts: st.tuples(st.just(ts), st.integers(len(ts), 80), st.permutations(range(len(ts))))))
def test_invariant_to_request_order(case):
    ts, budget, perm = case
    scores = [lr for t in ts for lr in t.log_rho]
    assert len(set(scores)) == len(scores)
    sel = select_budget(ts, budget)
    shuffled = select_budget([ts[k] for k in perm], budget)
    for new, old in enumerate(perm):
        assert shuffled.kept_ids[new] == sel.kept_ids[old]
        assert shuffled.expected_accepted[new] == sel.expected_accepted[old]


@settings(max_examples=40)
@given(tied_batches.flatmap(lambda ts: st.tuples(st.just(ts), st.integers(1, 60),
                                                 st.permutations(range(len(ts))))))
def test_order_invariance_of_scores_with_ties(case):
    ts, budget, perm = case
    a = select_budget(ts, budget, min_per_request=0)
    b = select_budget([ts[k] for k in perm], budget, min_per_request=0)
    assert kept_scores(ts, a) == kept_scores([ts[k] for k in perm], b)


@settings(max_examples=40)
@given(batches.flatmap(lambda ts: st.tuples(st.just(ts), st.integers(1, 80),
                                            st.integers(1, 4), st.integers(1, 10))))
def test_minimum_and_cap(case):
    ts, budget, m, extra = case
    cap = m + extra
    need = sum(min(m, len(t.best_path())) for t in ts)
    if budget < need:
        with pytest.raises(InputError):
            select_budget(ts, budget, min_per_request=m, max_per_request=cap)
        return
    sel = select_budget(ts, budget, min_per_request=m, max_per_request=cap)
    assert sel.n_kept <= budget
    assert_prefix_connected(ts, sel)
    for b, t in enumerate(ts):
        assert set(t.best_path()[:m]) <= set(sel.kept_ids[b])
        assert len(sel.kept_ids[b]) <= cap
    # budget left over only when every request is capped or exhausted
    if sel.n_kept < budget:
        assert all(len(ids) == min(cap, len(t)) for ids, t in zip(sel.kept_ids, ts))


def test_worked_example():
    # request 0: root 1.0 -> a 0.9 -> b 0.8 ; root -> c 0.05
    # request 1: root 1.0 -> d 0.6 -> e 0.5
    t0 = ProposalTree.from_probs([-1, 0, 1, 0], [1.0, 0.9, 0.8, 0.05])
    t1 = ProposalTree.from_probs([-1, 0, 1], [1.0, 0.6, 0.5])
    sel = select_budget([t0, t1], 5)
    # scores: t0 1, .9, .72, .05 ; t1 1, .6, .3 -> best five: 1, 1, .9, .72, .6
    assert sel.kept_ids == ((0, 1, 2), (0, 1))
    assert sel.forest.parents == (-1, 0, 1, -1, 0)
    assert sel.forest.cu_seqlens == (0, 3, 5)
    assert sel.expected_accepted == pytest.approx((1 + 0.9 + 0.72, 1 + 0.6))
    assert sel.expected_accepted_full == pytest.approx((1 + 0.9 + 0.72 + 0.05, 1 + 0.6 + 0.3))
    assert sel.kept_mask(0, 4) == [True, True, True, False]
    d = sel.to_dict()
    assert d["kept_nodes"] == 5 and d["cu_seqlens"] == [0, 3, 5]


def test_minimum_follows_best_path_and_cap_moves_budget():
    weak = ProposalTree.from_probs([-1, 0, 1], [0.01, 0.5, 0.5])
    strong = chain_tree(6, prob=0.95)
    sel = select_budget([strong, weak], 4, min_per_request=2)
    assert sel.kept_ids == ((0, 1), (0, 1))
    sel = select_budget([strong, weak], 6, min_per_request=0, max_per_request=3)
    assert sel.kept_ids == ((0, 1, 2), (0, 1, 2))
    sel = select_budget([strong, weak], 3, min_per_request=0)
    assert sel.kept_ids == ((0, 1, 2), ())
    assert sel.forest.cu_seqlens == (0, 3, 3) and sel.forest.tree(1) is None


def test_ties_across_requests_go_to_the_first():
    t = chain_tree(3, prob=1.0)
    # every root is kept first (the minimum), then ties go by request, then node index
    assert select_budget([t, t, t], 5).kept_ids == ((0, 1, 2), (0,), (0,))
    assert select_budget([t, t, t], 6).kept_ids == ((0, 1, 2), (0, 1), (0,))
    assert select_budget([t, t, t], 6, min_per_request=0).kept_ids == ((0, 1, 2), (0, 1, 2), ())


def test_best_first_is_the_order_a_budget_keeps():
    assert best_first([0.0, -1.0, -0.5, -1.0, -0.5, -math.inf]) == [0, 2, 4, 1, 3, 5]
    t = beam_tree(4, 3, seed=5)
    order = best_first(t.log_rho)
    for n in (1, 5, 17, len(t)):
        assert sorted(select_budget([t], n).kept_ids[0]) == sorted(order[:n])


def test_budget_larger_than_batch_keeps_everything():
    ts = [beam_tree(2, 2, seed=s) for s in range(3)]
    sel = select_budget(ts, 10_000)
    assert sel.n_kept == sum(len(t) for t in ts)
    assert sel.expected_accepted == pytest.approx(sel.expected_accepted_full)


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget=2), "budget 2 is smaller than the number of requests (3)"),
    (dict(budget=0), "budget must be an integer >= 1, got 0"),
    (dict(budget=5, min_per_request=2), "cannot cover the minimum of 2 nodes per request"),
    (dict(budget=9, min_per_request=-1), "min_per_request must be an integer >= 0"),
    (dict(budget=9, min_per_request=3, max_per_request=2), "max_per_request (2) is smaller"),
])
def test_errors(kwargs, message):
    ts = [chain_tree(4)] * 3
    with pytest.raises(InputError) as info:
        select_budget(ts, **kwargs)
    assert message in str(info.value)


def test_empty_batch():
    with pytest.raises(InputError, match="batch is empty"):
        select_budget([], 4)


def test_expected_accepted_curve_is_monotone():
    ts = [beam_tree(4, 3, seed=s) for s in range(4)]
    curve = expected_accepted_curve(ts, [4, 8, 16, 32, 64, 1000])
    assert curve == sorted(curve)
    assert curve[-1] == pytest.approx(sum(t.expected_accepted() for t in ts))


def test_selection_is_fast_enough_for_a_full_batch():
    import time

    ts = [beam_tree(16, 4, seed=s) for s in range(64)]  # 64 x 245 candidates
    start = time.perf_counter()
    sel = select_budget(ts, 4096)
    assert time.perf_counter() - start < 2.0
    assert sel.n_kept == 4096
