"""Acceptance files and the profiles that carry them: values checked, sizes capped.

An acceptance file (`--acceptance FILE` for calibrate and bench e2e) and a profile's
acceptance block go through the same checks (bole_cli/calibrate/acceptance.py): finite
numbers, committed tokens never above the tokens verified, and no more depths or ranks
than a tree of MAX_TREE_NODES can use; each refusal is one line naming the file and the
field, at once.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.limits import MAX_TREE_DRAFTS

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "h200" / "Qwen3.5-9B.yaml"


def _calibrate(tmp_path: Path, doc: dict):
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps(doc))
    t0 = time.perf_counter()
    r = runner.invoke(cli.app, ["calibrate", "--gpu", "a100", "--model", "9b", "--batch", "8",
                                "--kv", "4096", "--acceptance", str(acc), "--no-plot",
                                "--out", str(tmp_path / "p.yaml")])
    return r, time.perf_counter() - t0


@pytest.mark.parametrize("doc, field", [
    ({"per_depth": [0.5] * (MAX_TREE_DRAFTS + 1)}, "per_depth"),
    ({"per_depth_rank": [[0.5]] * 2000}, "per_depth_rank"),
    ({"per_depth_rank": [[0.001] * (MAX_TREE_DRAFTS + 1)]}, "per_depth_rank[0]"),
    ({"per_depth": [0.5] * 8, "top_k": 10**9}, "top_k"),
    ({"per_depth": [0.5] * 8, "top_k": 5000}, "top_k"),
])
def test_deeper_or_wider_than_a_tree_is_refused_at_once(tmp_path, doc, field):
    r, took = _calibrate(tmp_path, doc)
    assert r.exit_code == 2, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and f"acc.json: {field}:" in line
    assert f"at most {MAX_TREE_DRAFTS}" in line
    assert took < 5


def test_the_deepest_and_widest_accepted_file_runs(tmp_path):
    r, took = _calibrate(tmp_path, {"per_depth": [0.5] * MAX_TREE_DRAFTS})
    assert r.exit_code == 0, r.stderr
    r, took = _calibrate(tmp_path, {"per_depth": [0.5] * 8, "top_k": MAX_TREE_DRAFTS})
    assert r.exit_code == 0, r.stderr
    assert took < 10


@pytest.mark.parametrize("curve, field", [
    ({"n": [1, 2, 4], "e_acc": [1, 2, math.inf]}, "curve.e_acc[2]"),
    ({"n": [1, 2, 4], "e_acc": [1, 2, 1e300]}, "curve.e_acc[2]"),
    ({"n": [1, 2, 4], "e_acc": [1, 1.5, 4.5]}, "curve.e_acc[2]"),
    ({"n": [1, 2, math.nan], "e_acc": [1, 1.5, 2]}, "curve.n[2]"),
])
def test_a_curve_is_checked_in_its_own_file(tmp_path, curve, field):
    r, _ = _calibrate(tmp_path, {"curve": curve})
    assert r.exit_code == 2, r.stderr
    assert f"acc.json: {field}:" in r.stderr and "p.yaml" not in r.stderr


def _bad_profile(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(PROFILE.read_text())
    change(data)
    path = tmp_path / "Qwen3.5-9B.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _set_e_acc(value):
    def change(data):
        for cfg in data["configs"]:
            cfg["e_acc"] = [value] * len(cfg["n"])
    return change


def _set_rows(rows):
    def change(data):
        data["acceptance"]["per_depth_rank"] = rows
    return change


@pytest.mark.parametrize("change, field", [
    (_set_e_acc(math.nan), "configs[0].e_acc"),
    (_set_e_acc(-math.inf), "configs[0].e_acc"),
    (_set_rows([[math.nan, 0.1]] * 8), "acceptance.per_depth_rank[0][0]"),
    (_set_rows([[0.9, 0.9, 0.9, 0.9]] * 8), "acceptance.per_depth_rank[0]"),
    (_set_rows("high"), "acceptance.per_depth_rank"),
])
def test_serve_checks_a_profile_as_strictly_as_an_acceptance_file(tmp_path, change, field):
    path = _bad_profile(tmp_path, change)
    r = runner.invoke(cli.app, ["serve", "--model", "9b", "--profile", str(path), "--dry-run"])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert f"Qwen3.5-9B.yaml: {field}" in r.stderr
