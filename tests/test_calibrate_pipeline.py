"""bole_cli.calibrate.pipeline, .summary and .plot's path: `bole calibrate` as library calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from bole_cli.calibrate.defaults import DEFAULT_BATCHES, DEFAULT_EPS, DEFAULT_GRID, DEFAULT_KV_LENS
from bole_cli.calibrate.pipeline import (check_out_path, int_list_text, plan_calibration,
                                         reproduce_command, run_calibration)
from bole_cli.calibrate.plot import plot_path_for
from bole_cli.calibrate.summary import summary_rows
from bole_cli.errors import InputError
from bole_cli.profiles import load_profile


def _plan(tmp_path, **over):
    args = dict(gpu="h200", model="9b", batches=[1, 4], kvs=[1024], points=[4, 8, 16, 32],
                eps=0.05, out=tmp_path / "p.yaml", estimate=True)
    args.update(over)
    return plan_calibration(**args)


def test_int_list_text_and_the_plot_path():
    assert int_list_text([1, 2, 4]) == "1,2,4"
    assert plot_path_for(Path("d/Qwen3.5-9B.yaml")) == Path("d/Qwen3.5-9B.png")
    assert plot_path_for(Path("d/x.yml")) == Path("d/x.png")


def test_reproduce_command_leaves_defaults_out():
    line = reproduce_command("h200", "9b", DEFAULT_BATCHES, DEFAULT_KV_LENS, DEFAULT_GRID,
                             DEFAULT_EPS, _default_preset(), "")
    assert line == "bole calibrate --gpu h200 --model 9b"
    line = reproduce_command("h200", "9b", [1], [1024], [8, 16], 0.1, "x.yaml", "--estimate")
    assert line == ("bole calibrate --gpu h200 --model 9b --batch 1 --kv 1024 --grid 8,16 "
                    "--eps 0.1 --acceptance x.yaml --estimate")


def _default_preset():
    from bole_cli.calibrate.acceptance import DEFAULT_PRESET

    return DEFAULT_PRESET


def test_check_out_path(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        check_out_path(tmp_path, "h200", "Qwen/Qwen3.5-9B")
    with pytest.raises(InputError, match="plot's name"):
        check_out_path(tmp_path / "p.png", "h200", "Qwen/Qwen3.5-9B")
    check_out_path(tmp_path / "new.yaml", "h200", "Qwen/Qwen3.5-9B")  # a new file is fine
    check_out_path(tmp_path / "new.YML", "h200", "Qwen/Qwen3.5-9B")
    for name in ("p.json", "p.txt", "p"):  # the writer writes YAML whatever the name says
        with pytest.raises(InputError, match=r"--out: .*a profile is YAML"):
            check_out_path(tmp_path / name, "h200", "Qwen/Qwen3.5-9B")


def test_check_out_path_refuses_the_shipped_profiles(tmp_path):
    """A user's run never lands over the repository's records: an estimate written over a
    shipped measured profile would replace it silently (found by a bad-input sweep)."""
    from bole_cli.profiles import shipped_profiles_dir

    shipped = shipped_profiles_dir()
    for path in (shipped / "h100" / "Qwen3.5-9B.yaml", shipped / "new-gpu" / "m.yaml",
                 shipped / "h100" / ".." / "h200" / "x.yml"):
        with pytest.raises(InputError, match="shipped profiles"):
            check_out_path(path, "h100", "Qwen/Qwen3.5-9B")
    check_out_path(tmp_path / "profiles" / "h100" / "Qwen3.5-9B.yaml", "h100", "Qwen/Qwen3.5-9B")


def test_check_out_path_names_a_symlink_loop(tmp_path):
    """A loop of links in --out's folders: one line naming --out (Python 3.11-3.12 raise
    RuntimeError from resolve())."""
    (tmp_path / "d1").symlink_to(tmp_path / "d2")
    (tmp_path / "d2").symlink_to(tmp_path / "d1")
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    for path in (tmp_path / "d1" / "x.yaml", tmp_path / "loop.yaml"):
        with pytest.raises(InputError, match="--out"):
            check_out_path(path, "h100", "Qwen/Qwen3.5-9B")


def test_plan_checks_before_any_sweep(tmp_path):
    with pytest.raises(InputError, match="--eps"):
        _plan(tmp_path, eps=0)
    with pytest.raises(InputError, match="exclude each other"):
        _plan(tmp_path, measure=True)
    with pytest.raises(InputError, match="no point reaches batch 64"):
        _plan(tmp_path, batches=[64])
    # a point past the largest batch's 256 tokens a request is never timed: named, not dropped
    with pytest.raises(InputError, match="--grid: 100000 would never be timed: batch 1"):
        _plan(tmp_path, batches=[1], points=[8, 100000])
    _plan(tmp_path, batches=[1], points=[8, 256])
    from bole_cli.calibrate.defaults import DEFAULT_GRID

    _plan(tmp_path, batches=[1], points=list(DEFAULT_GRID))  # its big points are for big batches
    # a batch past the default grid blames --batch, the option the user gave, not --grid
    with pytest.raises(InputError, match=r"--batch: 2000 is above the default grid's largest N \(1024"):
        _plan(tmp_path, batches=[2000], points=list(DEFAULT_GRID))
    plan = _plan(tmp_path)
    assert not plan.measured and plan.label == "ESTIMATED (roofline model, --estimate)"
    assert plan.command.endswith("--estimate") and plan.path == tmp_path / "p.yaml"


def test_run_writes_the_profile_and_announces_the_label(tmp_path):
    plan = _plan(tmp_path)
    said = []
    result = run_calibration(plan, announce=said.append, plot=False)
    assert said == [plan.label] and result.plot_path is None and not result.interrupted
    written = load_profile(tmp_path / "p.yaml")
    assert ([(c["batch"], c["b_ver"]) for c in written["configs"]]
            == [(c["batch"], c["b_ver"]) for c in result.profile["configs"]])
    assert "kernels" in written
    assert written["provenance"]["kind"] == "estimated"
    assert "cost_model" in written["provenance"]
    # a second run into the same file for another model is refused
    with pytest.raises(InputError, match="holds Qwen/Qwen3.5-9B"):
        _plan(tmp_path, model="4b")


def test_summary_rows_of_a_profile(tmp_path):
    profile = run_calibration(_plan(tmp_path), plot=False).profile
    rows = summary_rows(profile)
    assert [(r["batch"], r["kv_len"]) for r in rows] == [(1, 1024), (4, 1024)]
    for r, cfg in zip(rows, sorted(profile["configs"], key=lambda c: c["batch"])):
        assert r["b_ver"] == cfg["b_ver"] and r["t_dec"] == cfg["t_dec"]
        ch = cfg["decision"]["chosen"]  # every speedup printed counts drafting and sampling
        plain = cfg["batch"] / (cfg["t_dec"] + cfg["sample"]["fixed"]
                                + cfg["sample"]["per_token"] * cfg["batch"])
        assert r["speedup"] == pytest.approx(ch["tokens"] / (ch["t_draft"] + ch["t_verify"]
                                                             + ch["t_sample"]) / plain)
        assert r["decision"] == ch["label"] and (ch["mode"] == "none" or ch["t_draft"] > 0)


def test_an_estimate_says_which_profile_serve_takes(tmp_path, monkeypatch):
    """Without an H200, an ESTIMATED H200 table is not what `bole serve` uses when a
    measured profile ships: the run says so, and names both files."""
    import json as _json
    import shlex

    from typer.testing import CliRunner

    from bole_cli import cli
    from bole_cli.catalog import hardware as hw

    monkeypatch.setenv("BOLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)
    argv = ["calibrate", "--gpu", "h200", "--model", "9b", "--batch", "8", "--kv", "4096",
            "--no-plot"]
    r = CliRunner().invoke(cli.app, argv + ["--json"])
    assert r.exit_code == 0, r.output
    doc = _json.loads(r.stdout)
    assert "profiles/h200/Qwen3.5-9B.yaml; `bole serve` uses that one" in doc["served"]
    # how to serve the estimate instead, a command that pastes
    assert shlex.split(doc["serve_command"]) == ["bole", "serve", "--model", "Qwen3.5-9B",
                                                 "--profile", doc["path"]]
    # on screen at 80 columns: the command a flag a line, each but the last continued
    wide = CliRunner().invoke(cli.app, argv, env={"COLUMNS": "80"}, terminal_width=80)
    lines = wide.stdout.splitlines()
    at = lines.index("bole serve \\")
    assert lines[at + 1] == "  --model Qwen3.5-9B \\"
    end = next(i for i in range(at, len(lines)) if not lines[i].endswith("\\"))
    assert all(len(line) <= 80 for line in lines[at:end + 1])
    assert shlex.split("\n".join(lines[at:end + 1]).replace("\\\n", "")) == shlex.split(doc["serve_command"])
    r = CliRunner().invoke(cli.app, ["calibrate", "--gpu", "a100", "--model", "9b", "--batch",
                                     "8", "--kv", "4096", "--no-plot", "--json"])
    assert r.exit_code == 0 and _json.loads(r.stdout)["served"] is None  # nothing measured


def test_the_estimate_lists_a_verify_that_does_not_fit_as_the_measurement_did(tmp_path):
    """`bole calibrate`'s estimate checks memory (make_forward's RooflineForward): 27B on an
    80 GB A100 at batch 16 over 16k tokens stops its curve where the H100's measured profile
    ran out of memory (N 768), and says so in the profile and the warnings."""
    out = tmp_path / "p.yaml"
    plan = plan_calibration(gpu="a100", model="27b", batches=[16], kvs=[16384], points=list(DEFAULT_GRID),
                            eps=DEFAULT_EPS, out=out, estimate=True)
    result = run_calibration(plan, plot=False)
    failures = result.profile["provenance"]["failures"]
    assert len(failures) == 1 and failures[0].startswith("batch 16, kv 16384, N 768: Qwen/Qwen3.5-27B does not fit")
    assert "(weights 50.1 GiB, kv_cache 16.0 GiB, gdn_states 2.25 GiB and 7 more)" in failures[0]
    assert any("N 768" in w for w in result.warnings)
    assert max(result.profile["configs"][0]["n"]) == 512
    assert load_profile(out)["provenance"]["failures"] == failures


def test_cells_that_do_not_fit_are_rows_of_the_table_and_few_warnings(tmp_path):
    """A sweep over cells that do not fit the GPU: each failed cell keeps a row, marked
    failed, and the warnings show three failures and count the rest (a bad-input sweep
    found 60 unwrapped lines of 240 characters, and the cells missing from the table)."""
    import json as _json

    from typer.testing import CliRunner

    from bole_cli import cli

    out = tmp_path / "p.yaml"
    argv = ["calibrate", "--estimate", "--gpu", "h100", "--model", "27b", "--batch", "1,16,32",
            "--kv", "16384,32768", "--no-plot", "--out", str(out)]
    r = CliRunner().invoke(cli.app, argv + ["--json"])
    doc = _json.loads(r.stdout)
    failures = doc["profile"]["provenance"]["failures"]
    assert r.exit_code == 0 and len(failures) == 4  # batch 16 at 16k (N 768), 32 at both, 16 at 32k
    assert [w for w in doc["warnings"] if w.startswith("failed: ")] == [f"failed: {f}" for f in failures[:3]]
    assert doc["warnings"][-1] == "... and 1 more failure: all in the profile's provenance.failures"
    wide = CliRunner().invoke(cli.app, argv, env={"COLUMNS": "80"}, terminal_width=80)
    rows = {tuple(line.split()[:2]): line for line in wide.stdout.splitlines()
            if line.strip() and line.split()[0].isdigit()}
    assert set(rows) == {(b, kv) for b in ("1", "16", "32") for kv in ("16384", "32768")}
    failed = sorted(k for k, line in rows.items() if " failed " in f"{line} ")
    assert failed == [("16", "32768"), ("32", "16384"), ("32", "32768")]
    assert "failed: the cell's decode step failed" in " ".join(wide.stdout.split())
    assert all(len(line) <= 80 for line in wide.stdout.splitlines())


def test_a_model_given_as_a_checkpoint_folder_is_served_by_that_folder(tmp_path, monkeypatch):
    """The profile of a config.json outside the catalogue is served by the path the user
    gave (SGLang loads the folder), not by the config's file stem, a hub id that does not
    exist; a config file of another name cannot be loaded by SGLang and is refused."""
    import json as _json

    from bole_cli import serving

    config = _json.loads((Path(__file__).parent / "data" / "configs" / "qwen3_5_9b.json").read_text())
    config.pop("_name_or_path", None)
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    (folder / "config.json").write_text(_json.dumps(config))
    monkeypatch.setenv("BOLE_CACHE_DIR", str(tmp_path / "cache"))
    plan = _plan(tmp_path, model=str(folder), draft_vocab=32768)
    assert plan.serve_model == str(folder) and plan.model_spec.short_name == "my-finetune"
    assert run_calibration(plan, plot=False).serve_command[:4] == ["bole", "serve", "--model", str(folder)]
    monkeypatch.setattr(serving, "sglang_status", lambda: {
        "installed": False, "version": None, "pinned": "0.5.23", "plugin_registered": False})
    for given in (folder, folder / "config.json"):
        report = serving.plan_serve(str(given), profile=plan.path, dry_run=True).report
        at = report["command"].index("--model-path")
        assert report["command"][at + 1] == str(folder)
    other = tmp_path / "qwen.json"
    other.write_text(_json.dumps(config))
    with pytest.raises(InputError, match="--model: .*qwen.json is a config file, not a checkpoint"):
        serving.plan_serve(str(other), profile=plan.path, dry_run=True)


def test_a_model_without_an_mtp_layer_is_calibrated_with_a_warning(tmp_path):
    """Its own MTP head does not exist: the decision still prices a head of its width (an
    EAGLE draft model's cost is close), and the warning says how it is served."""
    import json as _json

    config = _json.loads((Path(__file__).parent / "data" / "configs" / "qwen3_5_9b.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 0
    path = tmp_path / "config.json"
    path.write_text(_json.dumps(config))
    result = run_calibration(_plan(tmp_path, model=str(path)), plot=False)
    assert result.warnings[0].endswith("has no MTP layer (its config's mtp_num_hidden_layers): the "
                                       "drafter priced is an MTP-style head of its width; `bole serve` "
                                       "speculates with --draft-model (EAGLE)")
    plain = _plan(tmp_path, out=tmp_path / "catalogue.yaml")
    assert not any("MTP" in w for w in run_calibration(plain, plot=False).warnings)


def test_a_long_estimate_shows_its_progress_and_a_short_one_does_not(tmp_path, monkeypatch):
    """An estimate of thousands of cells ran for minutes without a word (a bad-input sweep):
    past ESTIMATE_PROGRESS_STEPS it reports each step, as the measured sweep does."""
    from contextlib import contextmanager

    import bole_cli.calibrate.pipeline as pipeline

    seen: list[int] = []

    @contextmanager
    def progress(total):
        seen.append(total)
        yield lambda _desc: seen.append(-1)

    run_calibration(_plan(tmp_path), progress=progress, plot=False)
    assert seen == []
    monkeypatch.setattr(pipeline, "ESTIMATE_PROGRESS_STEPS", 5)
    run_calibration(_plan(tmp_path), progress=progress, plot=False)
    assert seen[0] > 5 and seen.count(-1) == seen[0]
