"""`bole inspect-tree` through the real app: views, --json, --plot and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bole_cli.cli import app
from bole_cli.trees import beam_tree_size

DATA = Path(__file__).parent / "data" / "trees"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["inspect-tree", *map(str, args)])


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_synthetic_json_with_budget_and_memory():
    data = run_json("--synthetic", "--depth", 8, "--topk", 4, "--seed", 0, "--budget", 32,
                    "--model", "9b", "--batch", 8)
    assert set(data) == {"source", "requests", "summary", "budget", "memory", "plot"}
    assert data["source"] == {"kind": "synthetic", "depth": 8, "topk": 4, "seed": 0,
                              "requests": 1}
    (req,) = data["requests"]
    assert req["nodes"] == beam_tree_size(8, 4) == 117
    assert req["depth"] == 8 and req["widths"] == [1, 4] + [16] * 7
    assert sum(req["kept"]) == req["kept_nodes"] == 32
    assert req["ancestor_mask"] is None  # > 32 nodes
    assert req["expected_accepted_budget"] <= req["expected_accepted"]
    # kept nodes are exactly the 32 best by rho, prefix-connected
    order = sorted(range(117), key=lambda i: (-req["log_rho"][i], i))
    assert {i for i, k in enumerate(req["kept"]) if k} == set(order[:32])
    for i, k in enumerate(req["kept"]):
        p = req["parents"][i]
        assert not k or p == -1 or req["kept"][p]
    b = data["budget"]
    assert b["budget"] == 32 and b["cu_seqlens"] == [0, 32] and len(b["parents"]) == 32
    m = data["memory"]
    assert m["batch"] == 8 and m["nodes"] == 32  # nodes default: what the budget keeps
    assert round(m["ratio"]) == 85
    assert m["sglang_buffer_shape"] == [24, 9, 32, 32, 128, 128]
    s = data["summary"]
    assert s["kept_nodes"] == 32 and s["expected_accepted"] == pytest.approx(
        req["expected_accepted"])


def test_synthetic_is_deterministic():
    a = run_json("--synthetic", "--seed", 3, "--depth", 3, "--topk", 2)
    b = run_json("--synthetic", "--seed", 3, "--depth", 3, "--topk", 2)
    assert a == b


def test_tree_file_rich_view_shows_tree_mask_and_pruning():
    result = run(DATA / "small.yaml", "--budget", 4)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "' cat'" in out and "pruned" in out
    assert "ancestor mask" in out
    assert "budget 4 over 7 candidates" in out
    assert "■" in out


def test_batch_file_selection_is_batch_wide():
    data = run_json(DATA / "batch.json", "--budget", 9)
    assert [r["nodes"] for r in data["requests"]] == [5, 5, 6]
    kept = [r["kept_nodes"] for r in data["requests"]]
    assert sum(kept) == 9 and all(k >= 1 for k in kept)
    assert data["budget"]["cu_seqlens"] == [0, kept[0], kept[0] + kept[1], 9]
    every = sorted((lr for r in data["requests"] for lr in r["log_rho"]), reverse=True)
    got = sorted((lr for r in data["requests"] for lr, k in zip(r["log_rho"], r["kept"]) if k),
                 reverse=True)
    assert got == every[:9]
    assert data["requests"][1]["ancestor_mask"][3] == [False, True, False, True, False]
    assert data["summary"]["widths"] == [1 + 2 + 1, 2 + 3 + 1, 1 + 1, 1 + 1, 1, 1]


def test_batch_defaults_to_the_requests_given():
    data = run_json(DATA / "batch.json", "--model", "27b")
    assert data["memory"]["batch"] == 3 and data["memory"]["nodes"] == 6
    data = run_json(DATA / "batch.json", "--model", "27b", "--nodes", 16,
                    "--state-dtype", "bfloat16")
    assert data["memory"]["nodes"] == 16 and data["memory"]["state_dtype"] == "bfloat16"


def test_sglang_input():
    data = run_json("--sglang", DATA / "sglang.json")
    (req,) = data["requests"]
    assert req["parents"] == [-1, 0, 0, 1, 1, 2]
    assert req["tokens"] == [42, 7, 9, 11, 13, 15]
    assert data["source"]["kind"] == "sglang"
    data = run_json("--sglang", DATA / "sglang_batch.yaml", "--budget", 5)
    assert [r["parents"] for r in data["requests"]] == [[-1, 0, 1, 0], [-1, 0, 0, 0]]


def test_memory_view():
    result = run("--synthetic", "--depth", 2, "--topk", 2, "--model", "122b", "--batch", 4)
    assert result.exit_code == 0, result.output
    assert "Transient verify memory" in result.stdout
    assert "101.8x" in result.stdout
    assert "KV-cache tokens" in result.stdout


def test_plot(tmp_path):
    png = tmp_path / "tree.png"
    data = run_json(DATA / "batch.json", "--budget", 8, "--plot", png)
    assert data["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    ([DATA / "bad_cycle.json"], "node 1: parents form a cycle (1 -> 2 -> 1)"),
    ([DATA / "bad_order.json"], "node 5: parent 7 is not before it"),
    ([DATA / "bad_dangling.json"], "node 2: parent 9 is out of range"),
    ([DATA / "bad_prob.json"], "node 1: probability 1.5 is outside (0, 1]"),
    ([DATA / "bad_prob_zero.json"], "node 2: probability 0 is outside (0, 1]"),
    ([DATA / "bad_nan.json"], "node 1: log-prob is NaN"),
    ([DATA / "bad_empty.json"], "tree is empty"),
    (["--sglang", DATA / "bad_sglang_order.json"], "node 1: parent 2 is not before it"),
    ([DATA / "batch.json", "--budget", 2], "budget 2 is smaller than the number of requests (3)"),
    ([DATA / "small.yaml", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    ([DATA / "missing.yaml"], "missing.yaml: file not found"),
    ([], "give exactly one of TREE_FILE, --sglang FILE or --synthetic"),
    ([DATA / "small.yaml", "--synthetic"], "give exactly one of"),
    ([DATA / "small.yaml", "--depth", 3], "--depth only applies with --synthetic"),
    ([DATA / "small.yaml", "--batch", 3], "--batch only applies with --model"),
    ([DATA / "small.yaml", "--max-per-request", 3], "--max-per-request only applies with --budget"),
    (["--synthetic", "--topk", 8], "--synthetic: depth 8 with topk 8 gives 457 nodes"),
    (["--synthetic", "--budget", 0], "--budget: expected an integer >= 1, got 0"),
    (["--synthetic", "--model", "9b", "--state-dtype", "int8"], "state dtype 'int8'"),
    (["--synthetic", "--plot", "tree.txt"], "--plot tree.txt: unsupported file type"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    assert message in " ".join(lines[0].split())
    assert result.stdout == ""


def test_bad_input_with_json_still_exits_2():
    result = run(DATA / "bad_cycle.json", "--json")
    assert result.exit_code == 2 and result.stdout == ""


def test_help_path_stays_light():
    code = ("import sys, bole_cli.commands.inspect_tree, bole_cli.trees, bole_cli.budget, "
            "bole_cli.memory; heavy = [m for m in ('torch', 'matplotlib', 'yaml', 'numpy') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_bad_state_dtype_names_the_option_and_what_it_takes():
    """Refused before the trees load (a missing file is not reached), naming --state-dtype
    and every dtype it accepts."""
    from bole_cli.memory import FLOAT_DTYPES

    result = run(DATA / "missing.yaml", "--model", "9b", "--state-dtype", "float64")
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: --state-dtype: ") and "'float64'" in line
    assert line.endswith("expected one of " + ", ".join(FLOAT_DTYPES))


def test_state_dtype_help_lists_exactly_what_is_accepted():
    from bole_cli.memory import FLOAT_DTYPES

    help_text = " ".join(runner.invoke(app, ["inspect-tree", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert f"recurrent state dtype, one of {', '.join(FLOAT_DTYPES)}." in help_text
    for name, alias in zip(FLOAT_DTYPES, ("fp32", "bf16", "fp16")):
        for given in (name, alias):
            data = run_json("--synthetic", "--model", "9b", "--state-dtype", given)
            assert data["memory"]["state_dtype"] == name
