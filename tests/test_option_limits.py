"""One wording for an integer option out of range, always naming the flag, and one limit
for every tree-sized option (bole_cli/parsing.py `check_int`, bole_cli/limits.py)."""

from __future__ import annotations

import json
import random
import re
import time

import pytest
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.inspection.report import DRAW_MAX_NODES
from bole_cli.trees.generators import random_tree

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

WORDING = re.compile(r"^error: (--[a-z-]+): expected an integer (>= [\d,]+|from [\d,]+ to "
                     r"[\d,]+), got ")


@pytest.mark.parametrize("argv, flag", [
    (["serve", "--gpu", "h200", "--model", "9b", "--batch", "-4", "--dry-run"], "--batch"),
    (["calibrate", "--gpu", "a100", "--model", "9b", "--batch", "0"], "--batch"),
    (["inspect-tree", "--synthetic", "--budget", "0"], "--budget"),
    (["inspect-tree", "--synthetic", "--depth", "0"], "--depth"),
    (["inspect-tree", "--synthetic", "--requests", "0"], "--requests"),
    (["inspect-tree", "--synthetic", "--model", "9b", "--nodes",
      "999999999999999999999"], "--nodes"),
    (["inspect-tree", "--synthetic", "--model", "9b", "--batch", "5000"], "--batch"),
    (["serve", "--gpu", "h200", "--model", "9b", "--dry-run", "--topk", "1", "--steps",
      "1000"], "--steps"),
    (["acceptance", "--model", "x", "--prompts", "y", "--depth", "0"], "--depth"),
])
def test_an_integer_out_of_range_is_one_wording_naming_the_flag(argv, flag):
    r = runner.invoke(cli.app, argv)
    assert r.exit_code == 2, r.stdout + r.stderr
    line = " ".join(r.stderr.split())
    match = WORDING.match(line)
    assert match and match.group(1) == flag, line


@pytest.mark.parametrize("argv, flag", [
    (["calibrate", "--gpu", "h200", "--model", "9b", "--batch", "1,4,4"], "--batch"),
    (["bench", "e2e", "--tiny", "--device", "cpu", "--batch", "2,1,2"], "--batch"),
    (["calibrate", "--gpu", "h200", "--model", "9b", "--kv", "1024,1024"], "--kv"),
    (["bench", "e2e", "--tiny", "--device", "cpu", "--decoders", "ar,bole,ar"], "--decoders"),
    (["bench", "e2e", "--tiny", "--device", "cpu", "--tree-shapes", "3x2,2x2,3x2"], "--tree-shapes"),
])
def test_a_repeated_list_value_is_refused_naming_the_flag_and_the_value(argv, flag):
    """'1,4,4' is more often a typo than a wish: exit 2 before any work, one line."""
    r = runner.invoke(cli.app, argv)
    assert r.exit_code == 2, r.stdout + r.stderr
    line = " ".join(r.stderr.split())
    assert line.startswith(f"error: {flag}: ") and "appears twice" in line, line
    assert "Traceback" not in r.stdout + r.stderr


def test_a_chain_is_held_to_the_tree_limit():
    """--topk 1 --steps 255 is the longest chain a request can verify (256 tokens)."""
    r = runner.invoke(cli.app, ["serve", "--gpu", "h200", "--model", "9b", "--dry-run",
                                "--topk", "1", "--steps", "255", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["num_draft_tokens"] == 256


def test_a_large_batch_is_summed_up_not_drawn_node_by_node(tmp_path):
    trees = [random_tree(random.Random(i), 256) for i in range(64)]
    path = tmp_path / "batch.json"
    path.write_text(json.dumps([{"parents": list(t.parents), "log_probs": list(t.log_probs)}
                                for t in trees]))
    t0 = time.perf_counter()
    r = runner.invoke(cli.app, ["inspect-tree", str(path), "--budget", "500"])
    assert r.exit_code == 0, r.stderr
    node_lines = [ln for ln in r.stdout.splitlines() if "ρ=" in ln]
    assert 0 < len(node_lines) <= DRAW_MAX_NODES
    assert "more requests not drawn" in r.stdout
    assert "kept 500 nodes" in " ".join(r.stdout.split())
    assert time.perf_counter() - t0 < 30
