"""bole_cli.calibrate.decision: the objective with drafting counted picks no speculation,
a chain or a tree for the reasons it should, and prices each choice consistently."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bole_cli.calibrate.acceptance import AcceptanceModel, preset, rank_matrix
from bole_cli.calibrate.decision import BucketCosts, candidates, chain_points, decide, price
from bole_cli.trees.generators import beam_tree_size


def _costs(batch=1, *, t_dec=0.01, draft=0.001, per_token_verify=2e-6, top=4, kv=4096):
    """A flat-then-linear verify curve over the grid and the chains' sizes."""
    n = sorted({x for x in (8, 16, 32, 48, 64, 96, 128, 192, 256) if batch <= x <= batch * 117}
               | set(chain_points(batch)))
    t_ver = [t_dec * 1.02 + per_token_verify * max(0, x - 32) for x in n]
    return BucketCosts(batch, kv, t_dec, n, t_ver, [draft * (1 + 0.05 * r) for r in range(top)],
                       5e-5, 1e-8)


def _model(rows):
    return AcceptanceModel("t", "test", q=[list(r) for r in rows])


def test_expensive_drafting_means_no_speculation():
    costs = _costs(draft=0.05)  # a drafter level costs five decode steps
    d = decide(costs, preset("paper-mbpp"))
    assert d.chosen.mode == "none" and d.chosen.tok_s == pytest.approx(1 / (0.01 + 5e-5 + 1e-8))
    assert d.runner_up is not None and d.runner_up.tok_s < d.chosen.tok_s


def test_acceptance_on_rank_1_means_a_chain():
    rows = [[0.95, 1e-6, 1e-6, 1e-6]] * 8  # lower ranks never right: a tree only costs more
    d = decide(_costs(), _model(rows))
    assert d.chosen.mode == "chain" and d.chosen.topk == 1
    assert d.best["tree"].tok_s < d.chosen.tok_s


def test_spread_acceptance_means_a_tree():
    rows = rank_matrix([0.55] * 8, 4, 0.9)  # rank 2-4 often right
    d = decide(_costs(), _model(rows))
    assert d.chosen.mode == "tree" and d.chosen.topk >= 2
    assert d.best["chain"].tok_s < d.chosen.tok_s


def test_every_price_counts_drafting_verify_and_sampling():
    costs, acc = _costs(4), preset("paper-cnndm")
    for c in candidates(costs, acc):
        assert c.step_s == pytest.approx(c.t_draft + c.t_verify + c.t_sample)
        assert c.tok_s == pytest.approx(c.tokens / c.step_s)
        assert (c.t_draft > 0) == (c.mode != "none")
        if c.mode == "tree":
            assert c.depth >= 1 and c.topk >= 2 and c.budget <= 4 * beam_tree_size(c.depth, c.topk)
            assert c.t_draft == pytest.approx(costs.draft_level[0]
                                              + (c.depth - 1) * costs.draft_level[c.topk - 1])
        if c.mode == "chain":
            assert c.budget == 4 * (c.depth + 1) and c.t_draft == pytest.approx(
                c.depth * costs.draft_level[0])
    d = decide(costs, acc).to_dict()
    assert d["best"]["none"]["speedup"] == pytest.approx(1.0)
    assert d["chosen"]["speedup"] == pytest.approx(d["chosen"]["tok_s"] / d["best"]["none"]["tok_s"])


def test_price_agrees_with_the_candidates_at_measured_points():
    costs, acc = _costs(4), preset("paper-mbpp")
    for c in candidates(costs, acc):
        p = price(costs, acc, c.mode, c.depth, c.topk, c.budget)
        assert p is not None and p.tok_s == pytest.approx(c.tok_s)
    # between measured points the verify time is interpolated; outside them nothing is priced
    mid = price(costs, acc, "tree", 8, 4, 80)
    assert costs.verify(64) < mid.t_verify < costs.verify(96)
    assert price(costs, acc, "tree", 8, 4, 4000) is None


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.3, 0.97), draft=st.floats(1e-5, 0.05), batch=st.sampled_from([1, 4, 16]))
def test_the_decision_is_the_best_candidate(a, draft, batch):
    costs = _costs(batch, draft=draft)
    acc = AcceptanceModel("t", "", q=rank_matrix([a * 0.97 ** d for d in range(8)], 4, 0.5))
    d = decide(costs, acc)
    pool = candidates(costs, acc)
    assert d.considered == len(pool)
    assert d.chosen.tok_s >= max(c.tok_s for c in pool) * (1 - 1e-9)
    for mode, best in d.best.items():
        assert math.isclose(best.tok_s, max(c.tok_s for c in pool if c.mode == mode))
    assert d.runner_up is None or d.runner_up.mode != d.chosen.mode


def test_a_chain_and_the_rank_1_beam_tree_commit_the_same():
    acc = preset("paper-gsm8k")
    for depth in range(1, 9):
        assert acc.tree(depth + 1, 1, depth, 1) == pytest.approx(acc.chain(depth))
        assert acc.tree(4 * (depth + 1), 4, depth, 1) == pytest.approx(4 * acc.chain(depth))


def test_missing_drafter_costs_price_no_tree_of_that_width():
    costs = BucketCosts(1, 4096, 0.01, [2, 3, 8, 16], [0.0102] * 4, [0.001, 0.0011], 5e-5, 0.0)
    pool = candidates(costs, preset("paper-mbpp"))  # levels measured up to 2 rows only
    assert {c.topk for c in pool if c.mode == "tree" and c.depth > 1} == {2}
    assert {c.topk for c in pool if c.mode == "tree" and c.depth == 1} == {2, 3, 4}  # 1 row


def test_ties_go_to_the_simpler_mode():
    """Ranks a file lacks enter the beam tree as 1e-12 placeholders: such a tree commits
    what its chain commits (plus 1e-12s) at the same cost, and the chain must win."""
    rows = [[0.9]] * 4  # top-1 only
    model = AcceptanceModel("t", "", q=[list(r) + [0.0, 0.0] for r in rows])
    costs = BucketCosts(1, 4096, 0.01, [2, 3, 4, 5, 8, 16], [0.0101] * 6, [0.001] * 3, 5e-5, 0.0)
    d = decide(costs, model)
    assert d.chosen.mode == "chain", d.chosen.label()
    tree = d.best["tree"]
    assert tree.tokens > d.chosen.tokens or tree.tok_s <= d.chosen.tok_s  # only 1e-12s apart


def test_trees_are_whole_per_request_budgets():
    """SGLang's --speculative-num-draft-tokens is per request: a batch budget that does not
    split evenly is never decided (serve could not run it)."""
    costs = BucketCosts(3, 4096, 0.01, [3, 8, 9, 12, 16, 24], [0.0101] * 6, [0.001] * 4, 5e-5, 0.0)
    pool = [c for c in candidates(costs, preset("paper-mbpp")) if c.mode == "tree"]
    assert pool and {c.budget for c in pool} == {9, 12, 24}


def test_a_wide_model_whose_own_tree_exceeds_256_nodes_still_calibrates(tmp_path):
    from typer.testing import CliRunner

    from bole_cli import cli

    f = tmp_path / "wide.yaml"
    f.write_text("name: wide\ntop_k: 6\nper_depth: [0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]\n")
    assert AcceptanceModel("w", "", q=rank_matrix([0.8] * 8, 6)).shape == (8, 5)  # 8x6: 259
    r = CliRunner().invoke(cli.app, ["calibrate", "--gpu", "a100", "--model", "4b", "--estimate",
                                     "--batch", "1", "--kv", "1024", "--acceptance", str(f),
                                     "--out", str(tmp_path / "p.yaml"), "--no-plot", "--json"])
    assert r.exit_code == 0, r.output
