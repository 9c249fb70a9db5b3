"""The library behind `bole inspect-tree`: option checks, sources, the report, the layout
and the Rich renderables (bole_cli.inspection.report, bole_cli.inspection.plot, bole_cli.inspection.view)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bole_cli.errors import InputError
from bole_cli.inspection.plot import PLOT_SUFFIXES, tidy_layout
from bole_cli.inspection.report import (MASK_MAX_NODES, build_report, check_options, inspect_trees,
                                  load_source)
from bole_cli.trees import ProposalTree, beam_tree, beam_tree_size

# 0 -> (1, 2), 1 -> (3, 4): a root with two children, the first with two leaves
SMALL = ProposalTree.from_probs([-1, 0, 0, 1, 1], [1.0, 0.6, 0.3, 0.5, 0.25])


def test_tidy_layout_centres_parents_over_their_children():
    x, x_prefix = tidy_layout(SMALL)
    assert x[3] == 0.0 and x[4] == 1.0 and x[2] == 2.0  # leaves left to right, depth first
    assert x[1] == 0.5 and x[0] == 1.25 and x_prefix == x[0]


def test_tidy_layout_of_a_forest_of_roots_and_a_chain():
    chain = ProposalTree.from_probs([-1, 0, 1], [0.9, 0.8, 0.7])
    assert tidy_layout(chain) == ([0.0, 0.0, 0.0], 0.0)
    two_roots = ProposalTree.from_probs([-1, -1], [0.5, 0.5])
    assert tidy_layout(two_roots) == ([0.0, 1.0], 0.5)


def test_build_report_of_one_tree_without_budget_or_memory():
    report = build_report([SMALL], {"kind": "file", "path": "t.json"})
    (req,) = report["requests"]
    assert req["nodes"] == 5 and req["depth"] == SMALL.draft_depth and req["kept"] is None
    assert req["depths"][0] == 0 and max(req["depths"]) == req["depth"]  # levels as the text shows them
    assert len(req["widths"]) == req["depth"] + 1
    assert req["ancestor_mask"] == SMALL.ancestor_mask()  # small enough to show
    assert report["summary"]["requests"] == 1 and report["summary"]["nodes"] == 5
    assert report["summary"]["expected_accepted"] == pytest.approx(SMALL.expected_accepted())
    assert report["budget"] is None and report["memory"] is None and report["plot"] is None


def test_build_report_sums_widths_over_the_batch():
    trees = [beam_tree(2, 2, 0), beam_tree(3, 2, 1)]
    s = build_report(trees, {"kind": "synthetic"})["summary"]
    assert s["depth"] == max(t.draft_depth for t in trees)
    assert sum(s["widths"]) == s["nodes"] == sum(t.n_nodes for t in trees)
    big = beam_tree(8, 4, 0)
    assert big.n_nodes > MASK_MAX_NODES
    assert build_report([big], {})["requests"][0]["ancestor_mask"] is None


def test_load_source_synthetic_defaults_and_errors():
    trees, source = load_source(None, None)
    assert source == {"kind": "synthetic", "depth": 8, "topk": 4, "seed": 0, "requests": 1}
    assert len(trees) == 1 and trees[0].n_nodes == beam_tree_size(8, 4)
    trees, source = load_source(None, None, depth=2, topk=2, seed=5, requests=3)
    assert [t for t in trees] == [beam_tree(2, 2, 5 + r) for r in range(3)]
    with pytest.raises(InputError, match="--requests"):
        load_source(None, None, requests=0)


def _check(**over):
    args = dict(tree_file=None, sglang=None, synthetic=True, synthetic_options={},
                budget=None, budget_options={}, model=None, model_options={}, plot=None)
    args.update(over)
    check_options(**args)


def test_check_options_names_the_flag():
    _check()  # a plain synthetic tree is fine
    with pytest.raises(InputError, match="exactly one of.*got none"):
        _check(synthetic=False)
    with pytest.raises(InputError, match="TREE_FILE and --synthetic"):
        _check(tree_file=Path("t.json"))
    with pytest.raises(InputError, match="--depth only applies with --synthetic"):
        _check(synthetic=False, tree_file=Path("t.json"), synthetic_options={"--depth": 3})
    with pytest.raises(InputError, match="--max-per-request only applies with --budget"):
        _check(budget_options={"--max-per-request": 3})
    with pytest.raises(InputError, match="--batch only applies with --model"):
        _check(model_options={"--batch": 2})
    with pytest.raises(InputError, match="unsupported file type '.jpg'"):
        _check(plot=Path("tree.jpg"))
    for suffix in PLOT_SUFFIXES:
        _check(plot=Path("tree" + suffix.upper()))


def test_inspect_trees_with_budget_and_memory():
    result = inspect_trees(synthetic=True, depth=3, topk=2, requests=2, budget=6, model="9b")
    assert len(result.trees) == 2 and result.selection.n_kept == 6
    assert result.report["summary"]["kept_nodes"] == 6
    assert result.memory.batch == 2 and result.memory.nodes == max(result.selection.forest.sizes)
    assert result.report["memory"] == result.memory.to_dict()


def test_tree_view_renders_labels_and_mask():
    from rich.console import Console

    from bole_cli.inspection.view import mask_renderable, node_label, tree_renderable

    assert "pruned" in node_label(SMALL, 2, False).plain
    assert "pruned" not in node_label(SMALL, 2, True).plain
    console = Console(width=120, record=True, color_system=None)
    console.print(tree_renderable(SMALL, [True, True, False, True, True], "request 0"))
    console.print(mask_renderable(SMALL.ancestor_mask()))
    text = console.export_text()
    assert "request 0" in text and "[4]" in text and "■" in text
